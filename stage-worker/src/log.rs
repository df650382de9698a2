//! Human-readable log lines on stderr, stamped with the seconds since the process started.

use std::sync::OnceLock;
use std::time::Instant;

static START: OnceLock<Instant> = OnceLock::new();

/// Marks the start of the process (the zero of the stamps); later calls change nothing.
pub fn start() {
    START.get_or_init(Instant::now);
}

/// Seconds since [`start`] (or since the first log line, if `start` was not called).
pub fn elapsed_s() -> f64 {
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Writes one line to stderr: `stage-worker [   1.23s] message`.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        eprintln!("stage-worker [{:7.2}s] {}", $crate::log::elapsed_s(), format_args!($($arg)*))
    };
}
