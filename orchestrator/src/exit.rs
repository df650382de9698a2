//! Exit statuses of `orchestrate`, in one place; the README ("Exit status") and
//! `orchestrate --help` list them for users.

/// Every stage succeeded and every GPU check passed.
pub const SUCCESS: i32 = 0;
/// At least one stage failed (after its retries).
pub const STAGE_FAILED: i32 = 1;
/// The plan or the command-line arguments are invalid; nothing ran.
pub const INVALID_INPUT: i32 = 2;
/// Every stage succeeded but a GPU was left holding memory (with `on_leak = "fail"`).
pub const GPU_LEAK: i32 = 3;
/// The run could not be set up or carried on (run directory, NVML required but absent, I/O).
pub const RUN_ERROR: i32 = 4;
/// Stopped by SIGINT, SIGTERM or SIGHUP; running stages were stopped and the journal says where.
pub const INTERRUPTED: i32 = 130;
/// Inside a Slurm job: stopped by the warning signal or SIGTERM, running stages stopped and
/// checkpointed, and the job requeued (`scontrol requeue`); its next start resumes the run.
pub const REQUEUED: i32 = 75;
