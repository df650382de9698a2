//! The run journal's records (`journal.jsonl` in a run directory): one JSON line per state
//! change, with the protocol version `v` and a timestamp `t` (milliseconds) beside the record's
//! fields. `orchestrate` appends them (its `journal` module says when they reach the disk);
//! `resume`, `status` and `report` read them back.

use crate::status::{RunStatus, StageStatus};
use serde::{Deserialize, Serialize};

/// One state change of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rec", rename_all = "snake_case")]
pub enum JournalRecord {
    /// The run began.
    RunStarted {
        /// Path of the plan file.
        plan: String,
        /// PID of the orchestrator.
        pid: u32,
        /// Whether GPU memory is being verified, or why not.
        gpu_check: String,
        /// Whether this continues an earlier run in the same directory (`--resume`).
        #[serde(default)]
        resumed: bool,
    },
    /// An attempt of a stage was launched.
    StageStarted {
        /// Stage name.
        stage: String,
        /// Attempt number, from 1.
        attempt: u32,
        /// PID of the stage's first process.
        pid: u32,
        /// UUIDs of the GPUs it was given.
        gpus: Vec<String>,
        /// The stage's fingerprint (see `fingerprint`).
        #[serde(default)]
        plan_hash: String,
    },
    /// An attempt ended.
    StageFinished {
        /// Stage name.
        stage: String,
        /// Attempt number.
        attempt: u32,
        /// "succeeded", "failed" or "cancelled".
        status: StageStatus,
        /// Why it failed, when it did.
        #[serde(default)]
        error: Option<String>,
        /// Verified outputs with checksums (on success).
        #[serde(default)]
        checkpoints: Vec<crate::report::CheckpointRecord>,
        /// The stage's fingerprint when it ran.
        #[serde(default)]
        plan_hash: String,
        /// The last metrics it reported.
        #[serde(default)]
        metrics: std::collections::BTreeMap<String, f64>,
        /// Wall time of the attempt, seconds.
        #[serde(default)]
        wall_s: Option<f64>,
    },
    /// A stage will not run because an upstream stage failed or the run stopped.
    StageSkipped {
        /// Stage name.
        stage: String,
        /// Why.
        reason: String,
    },
    /// A start of the run inside a Slurm job: the first, or one after a requeue.
    SlurmStarted {
        /// `SLURM_JOB_ID`.
        job_id: String,
        /// `SLURM_RESTART_COUNT` (0 for the first start).
        restart_count: u32,
        /// The node the batch script runs on.
        host: String,
        /// The job's nodes.
        nodelist: String,
    },
    /// The Slurm job is stopping: the signal, the cause read from Slurm's job state, and
    /// whether a requeue was asked for (see `slurm::stop`).
    SlurmStopped {
        /// `SLURM_JOB_ID`.
        job_id: String,
        /// `SLURM_RESTART_COUNT` of the start that stopped.
        restart_count: u32,
        /// The signal ("SIGUSR2", "SIGTERM").
        signal: String,
        /// "preemption", "time_limit", "cancel", "requeue", "signal" or "unknown".
        cause: String,
        /// The job's state as Slurm reported it, or why it could not be read.
        job_state: String,
        /// "requested", or why the job was not requeued.
        requeue: String,
    },
    /// The run ended.
    RunFinished {
        /// "succeeded", "succeeded_leaked", "failed", "interrupted", "requeued" (a Slurm job) or
        /// "leaked".
        status: RunStatus,
        /// Exit status of `orchestrate`.
        exit_code: i32,
    },
}
