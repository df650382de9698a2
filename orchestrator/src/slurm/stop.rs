//! The stop sequence of a run inside a Slurm job, once its stages have stopped: read why the
//! job is stopping from Slurm, journal it, ask Slurm to requeue the job, and pick the exit
//! status. The run calls [`after_stop`] after the run was interrupted by a signal, and shows
//! the user what the verdict says.
//!
//! Promises: a job that was cancelled (`scancel`) is never requeued; one that Slurm already
//! requeues is not requeued twice; every other stop asks `scontrol requeue` (30 s at most) and
//! says plainly when `scontrol` is missing or refuses. The journal and `slurm.json` record the
//! signal, the cause and the outcome before `orchestrate` exits.

use super::jobstate::{self, StopCause};
use super::{helper, history, Allocation};
use crate::events::journal::SharedJournal;
use crate::exit;
use crate::process::reaper::Reaper;
use protocol::report::SlurmStop;
use std::path::Path;
use std::time::Duration;

/// How long `scontrol requeue` may take.
pub const REQUEUE_TIMEOUT: Duration = Duration::from_secs(30);

/// The run's final status and `orchestrate`'s exit status after a stop, and what to tell the
/// user about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopVerdict {
    /// Requeued or interrupted.
    pub status: protocol::status::RunStatus,
    /// [`exit::REQUEUED`] or [`exit::INTERRUPTED`].
    pub exit_code: i32,
    /// The stop in one line: the signal, its cause, the requeue. A warning unless the job was
    /// requeued.
    pub message: String,
    /// Why the stop could not be recorded in the run directory, if it could not.
    pub unrecorded: Option<String>,
}

/// Whether `signal` (as "SIGTERM") stops a Slurm job for a requeue: the warning signals and
/// SIGTERM do; SIGINT (Ctrl-C at an interactive allocation) does not.
pub fn requeues_on(signal: &str) -> bool {
    matches!(signal, "SIGTERM" | "SIGUSR1" | "SIGUSR2")
}

/// Runs the stop sequence for `job`, stopped by `signal` at Unix time `at`. Journals the stop
/// (before the run's final record) and returns the verdict. Must run on the reaper's thread.
pub async fn after_stop(
    job: &Allocation,
    signal: &str,
    at: f64,
    reaper: &Reaper,
    journal: &SharedJournal,
    run_dir: &Path,
) -> StopVerdict {
    let state = jobstate::query(reaper, &job.job_id).await;
    let (cause, job_state) = match &state {
        Ok(s) => {
            let end = s.get("EndTime").and_then(jobstate::parse_slurm_time);
            let now = crate::timefmt::unix_secs_f64() as i64;
            (
                jobstate::classify(s, job.restart_count, now, end),
                s.summary(),
            )
        }
        Err(why) => (StopCause::Unknown, format!("unknown: {why}")),
    };
    let requeue = if !requeues_on(signal) {
        format!("not requested: {signal} is an interactive interrupt")
    } else {
        match cause {
            StopCause::Cancel => {
                "not requested: the job was cancelled (scancel), and a cancelled job stays stopped"
                    .to_string()
            }
            StopCause::Requeue => "not needed: Slurm is already requeuing the job".to_string(),
            _ => request_requeue(reaper, &job.job_id, run_dir).await,
        }
    };
    let requeued = requeue == "requested" || cause == StopCause::Requeue;
    let message = format!(
        "Slurm job {}: stopped by {signal}; cause: {} ({job_state}); requeue: {requeue}",
        job.job_id,
        cause.as_str()
    );
    let stop = SlurmStop {
        at,
        restart_count: job.restart_count,
        signal: signal.to_string(),
        cause: cause.as_str().to_string(),
        job_state,
        requeue,
    };
    let unrecorded = journal
        .with(|j| history::record_stop(run_dir, job, stop, j))
        .err()
        .map(|e| format!("cannot record the Slurm stop in the run directory: {e}"));
    let (status, exit_code) = match requeued {
        true => (protocol::status::RunStatus::Requeued, exit::REQUEUED),
        false => (protocol::status::RunStatus::Interrupted, exit::INTERRUPTED),
    };
    StopVerdict {
        status,
        exit_code,
        message,
        unrecorded,
    }
}

/// `scontrol requeue JOB`: "requested", or why not, with what to do.
async fn request_requeue(reaper: &Reaper, job_id: &str, run_dir: &Path) -> String {
    let argv: Vec<String> = ["scontrol", "requeue", job_id]
        .iter()
        .map(|s| s.to_string())
        .collect();
    match helper::run_for_output(reaper, &argv, REQUEUE_TIMEOUT).await {
        Ok(_) => "requested".to_string(),
        Err(why) => format!(
            "not possible: {why}; continue the run with `sbatch configs/slurm/pipeline.sbatch PLAN --run-dir {dir} --resume` (or `orchestrate resume {dir}`)",
            dir = run_dir.display()
        ),
    }
}
