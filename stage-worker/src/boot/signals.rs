//! SIGTERM and SIGINT: ask the stage to stop at the next safe point instead of dying.
//!
//! The handler only sets an atomic flag; training checks it after every optimizer step,
//! writes a resumable checkpoint and exits with `EXIT_INTERRUPTED`.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Installs the handler for SIGTERM and SIGINT. Returns the OS error if either fails.
pub fn install() -> std::io::Result<()> {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: a zeroed sigaction with a valid handler address, an empty mask and
        // SA_RESTART is a well-formed argument; the handler is async-signal-safe.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether SIGTERM or SIGINT has arrived since start.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
