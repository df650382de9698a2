//! Exclusive `flock` locks on files that name their holder: a run directory's `lock`, a runs
//! directory's `daemon.lock`. The kernel holds the lock for the life of the descriptor, so a
//! holder that dies however it dies (`kill -9` included) leaves no stale lock behind.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// The lock file at `path`, opened (created if missing, never truncated) and, when no other
/// descriptor holds it, locked exclusively. The bool says whether this call got the lock; when
/// it did not, the file is still returned so that the caller can read who holds it. Errors are
/// those of opening the file or of `flock` other than "held by someone else".
pub fn open_and_try_lock(path: &Path) -> io::Result<(File, bool)> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    // SAFETY: flock(2) on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok((file, true));
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok((file, false));
    }
    Err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_descriptor_does_not_get_a_held_lock_until_the_first_is_closed() {
        let dir = crate::testutil::scratch("file-lock");
        let path = dir.join("lock");
        let (first, got) = open_and_try_lock(&path).unwrap();
        assert!(got);
        let (_, got_again) = open_and_try_lock(&path).unwrap();
        assert!(!got_again);
        drop(first);
        assert!(open_and_try_lock(&path).unwrap().1);
    }
}
