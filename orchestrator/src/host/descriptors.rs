//! The process's file descriptors: the soft `RLIMIT_NOFILE` raised to the hard one at the
//! daemon's start, and an accept loop's answer to a failed `accept` (out of descriptors
//! included) that neither spins nor stops.

use std::io;
use std::time::{Duration, Instant};

/// Raises the soft limit on open files to the hard one; (the soft limit before, after).
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a pointer to a live rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur >= limit.rlim_max {
        return Ok((before, before));
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((before, limit.rlim_max))
}

/// Whether `error` says the process (or the system) is out of descriptors or buffers.
pub fn out_of_descriptors(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Pauses after a failed `accept`: [`AcceptErrors::OUT_OF_DESCRIPTORS_PAUSE`] when out of
/// descriptors (the connection waits in the backlog; the other tasks run meanwhile), a
/// shorter pause for anything else (a peer gone before it was taken). Logs the first failure
/// of a run of them and, when `accept` works again, how many there were.
#[derive(Debug, Default)]
pub struct AcceptErrors {
    since: Option<Instant>,
    count: u64,
}

impl AcceptErrors {
    /// The pause after an `accept` that failed for want of descriptors.
    pub const OUT_OF_DESCRIPTORS_PAUSE: Duration = Duration::from_millis(20);
    /// The pause after any other failed `accept`.
    pub const OTHER_PAUSE: Duration = Duration::from_millis(5);

    /// Records `error` on listener `what` and waits the pause it calls for.
    pub async fn failed(&mut self, what: &str, error: &io::Error) {
        if self.since.is_none() {
            self.since = Some(Instant::now());
            tracing::warn!("{what}: accept failed: {error}; retrying");
        }
        self.count += 1;
        let pause = if out_of_descriptors(error) {
            Self::OUT_OF_DESCRIPTORS_PAUSE
        } else {
            Self::OTHER_PAUSE
        };
        tokio::time::sleep(pause).await;
    }

    /// Records an `accept` that worked.
    pub fn accepted(&mut self, what: &str) {
        if let Some(since) = self.since.take() {
            tracing::warn!(
                "{what}: accept works again after {} failures in {:.1} s",
                self.count,
                since.elapsed().as_secs_f64()
            );
            self.count = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let (before, after) = raise_nofile_limit().unwrap();
        assert!(after >= before);
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit with a pointer to a live rlimit.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!(limit.rlim_cur, limit.rlim_max);
        assert_eq!(after, limit.rlim_cur);
    }

    #[test]
    fn descriptor_exhaustion_is_recognised() {
        assert!(out_of_descriptors(&io::Error::from_raw_os_error(
            libc::EMFILE
        )));
        assert!(out_of_descriptors(&io::Error::from_raw_os_error(
            libc::ENFILE
        )));
        assert!(!out_of_descriptors(&io::Error::from_raw_os_error(
            libc::ECONNABORTED
        )));
    }
}
