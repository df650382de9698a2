//! `report.json`: one record per stage, derived from the run's journal.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::status::{FailureClass, NodeVerdict, RunStatus, StageStatus};

/// The report of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Report {
    /// Protocol version ([`crate::PROTOCOL_VERSION`]).
    pub v: u32,
    /// The run directory.
    pub run_dir: String,
    /// Overall outcome: "succeeded", "succeeded_leaked" (every stage succeeded but a GPU
    /// check found leaked memory), "failed", "interrupted", "requeued" (a Slurm job that
    /// stopped and was requeued) or "leaked" (`on_leak = "fail"`); "running" while it runs.
    pub status: RunStatus,
    /// Whether GPU memory was verified, and if not why.
    pub gpu_check: String,
    /// Wall time of the whole run.
    pub wall_s: f64,
    /// One record per stage, in plan order.
    pub stages: Vec<StageReport>,
    /// The Slurm job the run belongs to, with every stop and requeue (absent outside Slurm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmJobReport>,
}

/// A run inside a Slurm job: the job and each time it stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SlurmJobReport {
    /// `SLURM_JOB_ID`.
    pub job_id: String,
    /// The job's nodes (`SLURM_JOB_NODELIST`, as Slurm writes it).
    pub nodelist: String,
    /// How many times the job has been requeued so far (`SLURM_RESTART_COUNT` of the latest start).
    pub restart_count: u32,
    /// Every start of the job in this run directory, in order.
    pub starts: Vec<SlurmStart>,
    /// Every stop of the job (signal, cause, requeue), in order.
    pub stops: Vec<SlurmStop>,
}

/// One start of the job (the first, or one after a requeue).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SlurmStart {
    /// Unix time, seconds.
    pub at: f64,
    /// `SLURM_RESTART_COUNT` (0 for the first start).
    pub restart_count: u32,
    /// The host the batch script ran on.
    pub host: String,
}

/// One stop of the job: what signalled it, why (from Slurm's job state), and the requeue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SlurmStop {
    /// Unix time of the signal, seconds.
    pub at: f64,
    /// `SLURM_RESTART_COUNT` of the start that stopped.
    pub restart_count: u32,
    /// The signal that stopped the run ("SIGUSR2", "SIGTERM").
    pub signal: String,
    /// "preemption", "time_limit", "cancel", "requeue" (asked from outside) or "signal" (sent
    /// with the job running normally: `scancel --signal`, a node being drained).
    pub cause: String,
    /// The job's state as Slurm reported it (`JobState`, `Reason`, …), or why it could not be read.
    pub job_state: String,
    /// "requested" (`scontrol requeue` accepted), or why the job was not requeued.
    pub requeue: String,
}

/// The outcome of one task of a stage that ran through `srun`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TaskRecord {
    /// Global rank (`SLURM_PROCID`).
    pub rank: u32,
    /// Rank on its node (`SLURM_LOCALID`).
    pub local_rank: u32,
    /// The node it ran on.
    pub node: String,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did ("SIGTERM").
    pub signal: Option<String>,
}

/// The GPU check of one node after a stage that ran through `srun`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeGpuCheck {
    /// The node.
    pub node: String,
    /// "clean", "not_clean", "unavailable" (no NVML there) or "failed" (the check did not run).
    pub verdict: NodeVerdict,
    /// What `orchestrate gpu-check` said: GPUs and their memory, or why it could not look.
    pub detail: String,
}

/// What happened to one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StageReport {
    /// The stage's name.
    pub name: String,
    /// "succeeded", "failed", "skipped" (see `failure` for why), "cancelled", "running",
    /// "pending", or "interrupted" (running when its run was killed).
    pub status: StageStatus,
    /// Attempts made.
    pub attempts: u32,
    /// Exit code of the last attempt, when it exited.
    pub exit_code: Option<i32>,
    /// Signal that ended the last attempt, by name ("SIGKILL"), when it was signalled.
    pub signal: Option<String>,
    /// Why it failed, for the user.
    pub error: Option<String>,
    /// The class of failure: "exit_code", "signal", "killed_externally", "timeout",
    /// "cuda_oom", "reported", "bad_input", "protocol_violation", "missing_outputs",
    /// "corrupt_output", "spawn_failed", "no_gpu"; for a skipped stage why it did not run:
    /// "upstream_failed", "interrupted", "fail_fast", "gpu_leaked".
    pub failure: Option<FailureClass>,
    /// The last lines of the last attempt's stderr, when it failed.
    pub stderr_tail: Option<String>,
    /// The output directory.
    pub output_dir: String,
    /// Verified output files with checksums.
    pub checkpoints: Vec<CheckpointRecord>,
    /// Wall time of the last attempt, seconds.
    pub wall_s: Option<f64>,
    /// Final metrics reported by the stage.
    pub metrics: BTreeMap<String, f64>,
    /// Per-GPU memory verification: one entry per GPU the stage had.
    pub gpu: Vec<GpuRecord>,
    /// Processes that outlived the stage's main process and were stopped ("pid N (name)").
    #[serde(default)]
    pub leftover_processes: Vec<String>,
    /// Malformed messages the stage sent on its event channel (the first 20).
    #[serde(default)]
    pub protocol_violations: Vec<String>,
    /// When the last attempt's milestones happened.
    #[serde(default)]
    pub timing: Option<StageTiming>,
    /// The last attempt was started early: while an upstream stage it reads from, whose GPU
    /// had been handed on at its release, still persisted its outputs (its finish was
    /// recorded after theirs).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub started_early: bool,
    /// CPU time and memory of the last attempt's processes.
    #[serde(default)]
    pub host: Option<HostUsage>,
    /// Stages run through `srun`: every task of the last attempt, by rank.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskRecord>,
    /// Stages run through `srun`: the GPU check of every node of the stage, after it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeGpuCheck>,
    /// Stages placed as job steps over an allocation's nodes: every attempt that was lost on
    /// its node (the step killed by Slurm, the node gone) before its task could say how it
    /// ended, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<LostAttempt>,
    /// Stages with `preload`: how the last attempt's first process was started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StageStart>,
}

/// An attempt of a placed stage that was lost on a node of the allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LostAttempt {
    /// The attempt (1 for the first).
    pub attempt: u32,
    /// The node (Slurm's name) the attempt's step ran on when it was lost.
    pub node: String,
    /// The job step (`JOB.STEP`) that was lost.
    pub step: String,
}

/// How a stage's first process was started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StageStart {
    /// `zygote` (forked from a Python process that had imported the stage's `preload`
    /// modules) or `exec` (a fresh interpreter).
    pub via: StartVia,
    /// Why it was exec'd although it asked for the zygote (absent when forked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// Forked: the generation of the zygote it was forked from (1: the modules as written,
    /// or none for `"auto"`; each later one also imports what stages forked from an earlier
    /// one imported themselves; docs/zygote.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u32>,
    /// Forked, once it has exited through Python's own exit: the modules it imported itself,
    /// which the zygote had not (absent when it was killed, or ended with `os._exit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported: Option<ImportedAfterFork>,
    /// Forked: the modules its zygote's lineage learned but leaves out, and why (their import
    /// failed, started a thread, initialised CUDA or read a per-stage variable): a stage
    /// imports them itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<crate::fork::LeftOut>,
    /// Forked: what its zygote read ahead from the script of the stage it was started for
    /// (the modules that script imports at its top level, which the zygote imported before
    /// it was ready, e.g. `transformers:LlamaForCausalLM`); absent where it read none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_ahead: Option<crate::fork::ReadAhead>,
    /// Forked: it began as a standby, forked from the zygote while the stages before it ran,
    /// which started the CUDA driver and imported the modules the zygote leaves out for a
    /// thread before it was given this stage (docs/zygote.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub standby: bool,
    /// Forked with GPUs but not as a standby: why the standby of its zygote was not taken (it
    /// was still importing, exited, was refused, held a CUDA context, or none could be
    /// started); absent when none was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby_passed_over: Option<String>,
}

/// The modules a forked stage imported itself (see [`StageStart::imported`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ImportedAfterFork {
    /// How many.
    pub count: u32,
    /// The first few, in the order it imported them.
    pub first: Vec<String>,
}

/// The path a stage's first process took; see [`StageStart`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StartVia {
    /// Forked from the zygote.
    Zygote,
    /// Exec'd.
    Exec,
}

/// Host resources of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HostUsage {
    /// User CPU seconds of the first process and the descendants it waited for.
    pub cpu_user_s: f64,
    /// System CPU seconds, likewise.
    pub cpu_system_s: f64,
    /// Peak resident memory of the whole tree (sampled every 250 ms, summed over its
    /// processes), or of its largest single process if that was larger; with a cgroup that
    /// counts memory, the larger of that and `memory_peak_bytes`.
    pub peak_rss_bytes: u64,
    /// How the stage's processes were held together: `cgroup` (a cgroup v2 of its own) or
    /// `process_group` (its session and process group, found through `/proc`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    /// Its cgroup's highest memory use (`memory.peak`), bytes, where the kernel counts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak_bytes: Option<u64>,
    /// Its cgroup's `memory.max` (the plan's `memory`), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    /// Processes of its cgroup the kernel's OOM killer ended (`memory.events` `oom_kill`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<u64>,
    /// Forks its cgroup's `pids` limit refused (`pids.events` `max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_refused: Option<u64>,
}

/// How a stage's processes were held together and ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// A cgroup v2 of its own: membership, `cgroup.kill`, limits where set.
    Cgroup,
    /// Its session and process group, and the orchestrator's `/proc` scan.
    ProcessGroup,
}

/// Milestones of one attempt, as Unix time in seconds (microsecond precision).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StageTiming {
    /// The first process was spawned.
    pub spawned: f64,
    /// The first process's exit status was collected.
    pub exited: f64,
    /// No process of the stage was left.
    pub tree_gone: f64,
    /// Every GPU of the stage had its verdict (equals `tree_gone` without GPU check).
    pub verified: f64,
    /// The stage released its GPUs (a `released` event that held): their verdicts were taken
    /// then and they went to the next stage while this one's processes still ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<f64>,
}

/// A verified output file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CheckpointRecord {
    /// Absolute path.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Its checksum, written as `"blake3": "<hex>"` (what `orchestrate` and `stage-worker`
    /// compute) or `"sha256": "<hex>"` (version 1 manifests, the Python client's reports).
    #[serde(flatten)]
    pub checksum: crate::checkpoint::Checksum,
}

/// Memory verification of one GPU around one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GpuRecord {
    /// NVML UUID.
    pub uuid: String,
    /// Used bytes before the stage started.
    pub baseline_bytes: u64,
    /// Highest used bytes sampled during the stage.
    pub peak_bytes: u64,
    /// Used bytes at the verdict.
    pub after_bytes: u64,
    /// From the stage's last process gone to the first clean reading, milliseconds.
    pub reclaim_ms: f64,
    /// Whether the memory came back.
    pub verdict: GpuVerdict,
    /// Processes still holding memory at a verdict other than clean ("pid name bytes").
    #[serde(default)]
    pub holders: Vec<String>,
    /// Why the verdict is what it is, when it is not clean (who holds the memory, or why the
    /// holders could not be attributed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The verdict was taken when the stage released the GPU (its `released` event), before
    /// its processes exited; `reclaim_ms` then counts from that event.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub at_release: bool,
    /// XIDs the driver reported for the GPU while the stage ran on it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xids: Vec<XidRecord>,
    /// Why the GPU's error counters, read after the stage, keep it from the next stage
    /// (pending row remaps, uncorrectable ECC errors), when they do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<String>,
}

/// An XID (a GPU error the driver reports through NVML) that hit a stage's GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct XidRecord {
    /// The XID number.
    pub xid: u64,
    /// What NVIDIA says it means.
    pub meaning: String,
    /// NVIDIA's recovery action.
    pub action: String,
    /// Its recovery needs a GPU reset or a reboot: the GPU was quarantined.
    pub needs_reset: bool,
    /// When it was seen, Unix seconds.
    pub at: f64,
}

/// Whether a GPU's memory came back after a stage (serialised as `"clean"`, `"leaked"` or
/// `"taken_by_other"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GpuVerdict {
    /// Back at the baseline, within the tolerance, with no process of the stage left on it.
    Clean,
    /// Still above the baseline when the reclaim timeout ran out, with memory held by the
    /// stage's own processes, by no listed process, or by processes that cannot be told apart.
    Leaked,
    /// Above the baseline only because of processes outside the stage's tree (another user, a
    /// notebook): not the stage's leak. The GPU is busy; no stage gets it until it is empty.
    TakenByOther,
}

impl GpuVerdict {
    /// The verdict as the report writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuVerdict::Clean => "clean",
            GpuVerdict::Leaked => "leaked",
            GpuVerdict::TakenByOther => "taken_by_other",
        }
    }
}

impl std::fmt::Display for GpuVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
