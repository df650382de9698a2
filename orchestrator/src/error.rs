//! The library's error type: why a run, the daemon or the host could not be set up or carried
//! on (`orchestrate` exits 4 with it). Each message says what was being done and on which path;
//! the binary only prints it.

/// Why a run, the daemon or the host could not be set up or carried on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The plan cannot run here as it stands (GPUs it requires, Slurm, the stage worker), or a
    /// socket or directory is not what it must be; the message says what to do.
    #[error("{0}")]
    Refused(String),
    /// An operating-system call failed while doing `what` (which names the path).
    #[error("{what}: {source}")]
    Io {
        /// What was being done, on which path.
        what: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// An I/O error whose message already names its file (the journal's).
    #[error(transparent)]
    Os(#[from] std::io::Error),
    /// The run directory refused: its lock is held, or its files are not a run's.
    #[error(transparent)]
    RunDir(#[from] crate::store::rundir::RunDirError),
    /// The plan cannot run in (or outside) this Slurm job as it stands.
    #[error(transparent)]
    Slurm(#[from] crate::slurm::SlurmError),
    /// A background task of the run stopped without an answer.
    #[error("{0}")]
    Internal(String),
}

/// A result with the library's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Says what was being done when an operating-system call failed.
pub trait Context<T> {
    /// The failure as [`Error::Io`] with `what`.
    fn context(self, what: &str) -> Result<T>;
    /// [`Context::context`] with the description built only on failure.
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<std::io::Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: &str) -> Result<T> {
        self.map_err(|e| Error::Io {
            what: what.to_string(),
            source: e.into(),
        })
    }

    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::Io {
            what: what(),
            source: e.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_failure_says_what_was_being_done_and_keeps_its_cause() {
        let failed: std::result::Result<(), std::io::Error> =
            Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        let e = failed.context("cannot write /r/journal.jsonl").unwrap_err();
        assert!(e
            .to_string()
            .starts_with("cannot write /r/journal.jsonl: No space left"));
        assert!(std::error::Error::source(&e).is_some());
    }
}
