//! Human-readable log lines on stderr, stamped with the seconds since the process started.

use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The zero of the stamps, and the same instant in Unix seconds.
static START: Mutex<Option<(Instant, f64)>> = Mutex::new(None);

fn now() -> (Instant, f64) {
    (Instant::now(), unix_now())
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Marks the start of the process (the zero of the stamps); later calls change nothing.
pub fn start() {
    let mut s = START.lock().unwrap_or_else(|e| e.into_inner());
    s.get_or_insert_with(now);
}

/// Marks the start of a worker forked by the fork server: the zero of its stamps is now.
pub fn restart() {
    *START.lock().unwrap_or_else(|e| e.into_inner()) = Some(now());
}

fn started() -> (Instant, f64) {
    *START
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(now)
}

/// Seconds since [`start`] (or since the first log line, if `start` was not called).
pub fn elapsed_s() -> f64 {
    started().0.elapsed().as_secs_f64()
}

/// When this worker started ([`start`] or [`restart`]), in Unix seconds.
pub fn started_unix() -> f64 {
    started().1
}

/// Writes one line to stderr: `stage-worker [   1.23s] message`.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        eprintln!("stage-worker [{:7.2}s] {}", $crate::log::elapsed_s(), format_args!($($arg)*))
    };
}
