//! The daemon's exclusive hold on its runs directory.
//!
//! Promises: while a daemon lives, it holds an exclusive `flock` on `<runs-dir>/daemon.lock`,
//! which names its pid; a second daemon given the same runs directory (through any path to
//! it, and whatever its socket) refuses to start with an error naming the holder. The lock is
//! the kernel's, so it goes away with the daemon however it ends (`kill -9` included): a stale
//! file never blocks a restart. Stages never inherit it (the descriptor is close-on-exec).

use crate::error::{Context, Error, Result};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::Path;

/// The lock file's name in the runs directory.
pub const LOCK_FILE: &str = "daemon.lock";

/// A held lock on a runs directory; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct RunsDirLock {
    _file: File,
}

impl RunsDirLock {
    /// Takes `runs_dir` for this process, or says which daemon holds it.
    pub fn acquire(runs_dir: &Path) -> Result<RunsDirLock> {
        let path = runs_dir.join(LOCK_FILE);
        let (mut file, locked) = crate::store::file_lock::open_and_try_lock(&path)
            .with_context(|| format!("cannot lock {}", path.display()))?;
        if !locked {
            let holder = holder_pid(&mut file)
                .map(|pid| format!("pid {pid}"))
                .unwrap_or_else(|| "a process that has not written its pid yet".into());
            return Err(Error::Refused(format!(
                "the runs directory {} is already owned by another daemon ({holder}, which holds {}): \
                 stop that daemon (`orchestrate shutdown --socket …`) or give this one another --runs-dir",
                runs_dir.display(),
                path.display()
            )));
        }
        let pid = std::process::id();
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{pid}"))
            .and_then(|()| file.sync_data())
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(RunsDirLock { _file: file })
    }
}

/// The pid written in a lock file, if it holds one.
fn holder_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.take(64).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_hold_on_one_runs_directory_is_refused_naming_the_holder() {
        let dir = crate::testutil::scratch("runs-lock");
        let first = RunsDirLock::acquire(&dir).unwrap();
        let written = std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap();
        assert_eq!(written.trim(), std::process::id().to_string());
        // Another open file description of the same file conflicts, as another process's does.
        let err = RunsDirLock::acquire(&dir).unwrap_err().to_string();
        assert!(err.contains("already owned by another daemon"), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(first);
        let again = RunsDirLock::acquire(&dir).expect("free once the holder let go");
        drop(again);
    }
}
