//! Running a helper program (`scontrol`, `squeue`, `srun`) to its end, with a time limit.
//!
//! The orchestrator is a child subreaper whose reaper collects every exited child with
//! `wait4(-1)`, so a helper waited for in any other way would have its exit status stolen.
//! [`run`] registers the helper with the reaper in the same breath as spawning it, and
//! collects its output from files, not pipes, so a helper that prints a lot cannot block.

use crate::process::reaper::{ExitStatus, Reaper};
use std::io;
use std::process::{Command, Stdio};
use std::time::Duration;

/// What a helper did.
#[derive(Debug, Clone, PartialEq)]
pub struct HelperOutput {
    /// How it ended (`None` when it outran its time limit and was killed).
    pub status: Option<ExitStatus>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl HelperOutput {
    /// Whether it exited 0.
    pub fn success(&self) -> bool {
        self.status == Some(ExitStatus::Code(0))
    }

    /// One line on how it failed: its exit status and the gist of its stderr.
    pub fn failure(&self) -> String {
        let how = match self.status {
            None => "timed out".to_string(),
            Some(ExitStatus::Code(c)) => format!("exited with code {c}"),
            Some(ExitStatus::Signal(s)) => {
                format!("killed by {}", crate::process::tree::signal_name(s))
            }
        };
        let said = self.stderr.trim();
        if said.is_empty() {
            how
        } else {
            format!("{how}: {}", said.lines().last().unwrap_or(said))
        }
    }
}

/// Runs `argv` with stdin closed, waits at most `limit` (then SIGKILL), and returns what it
/// did. A program that cannot be started (not installed) is the `io::Error` of the spawn:
/// `ErrorKind::NotFound` when it is not on `PATH`. Must run on the thread of `reaper`.
pub async fn run(reaper: &Reaper, argv: &[String], limit: Duration) -> io::Result<HelperOutput> {
    let Some((program, args)) = argv.split_first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty command"));
    };
    let scratch = Scratch::new()?;
    let out = std::fs::File::create(scratch.path("out"))?;
    let err = std::fs::File::create(scratch.path("err"))?;
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()?;
    let pid = child.id() as i32;
    // No await between the spawn and this: the reaper runs on this thread.
    let exited = reaper.watch(pid);
    drop(child);
    let status = match tokio::time::timeout(limit, exited).await {
        Ok(Some(reaped)) => Some(reaped.status),
        Ok(None) => None,
        Err(_) => {
            // SAFETY: signalling the child we spawned; it is not reaped yet (we hold its watch).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            None
        }
    };
    let read = |name: &str| {
        let bytes = std::fs::read(scratch.path(name)).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Ok(HelperOutput {
        status,
        stdout: read("out"),
        stderr: read("err"),
    })
}

/// Why a helper program could not help.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// It ran but failed (exit status, signal or time limit), as [`HelperOutput::failure`]
    /// says.
    #[error("`{}` {}", .argv.join(" "), .output.failure())]
    Failed {
        /// Its command line.
        argv: Vec<String>,
        /// What it did.
        output: HelperOutput,
    },
    /// It is not on `PATH`.
    #[error("`{program}` is not installed here (not on PATH): Slurm's client commands are missing in this environment (a container without them?)")]
    NotInstalled {
        /// The program.
        program: String,
    },
    /// It could not be started for another reason.
    #[error("`{program}` could not be started: {source}")]
    CannotStart {
        /// The program.
        program: String,
        /// The failure.
        source: io::Error,
    },
}

/// Runs a program and says in one sentence why it could not help: not installed, timed out,
/// refused. `Ok` holds its stdout.
pub async fn run_for_output(
    reaper: &Reaper,
    argv: &[String],
    limit: Duration,
) -> Result<String, HelperError> {
    let program = argv.first().cloned().unwrap_or_default();
    match run(reaper, argv, limit).await {
        Ok(out) if out.success() => Ok(out.stdout),
        Ok(output) => Err(HelperError::Failed {
            argv: argv.to_vec(),
            output,
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(HelperError::NotInstalled { program }),
        Err(source) => Err(HelperError::CannotStart { program, source }),
    }
}

/// A private directory for one helper's output files, removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> io::Result<Scratch> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "orchestrate-helper-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
