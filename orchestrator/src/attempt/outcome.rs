//! How an attempt ended: its [`Outcome`], the [`Failure`] that names what went wrong, and
//! everything known about it when it ended ([`AttemptResult`]).

use crate::process::reaper::ExitStatus;
use crate::process::tree::StoppedProcess;
use protocol::report::{CheckpointRecord, GpuRecord};
use std::collections::BTreeMap;
use std::time::Duration;

/// Why an attempt failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// The program could not be started.
    SpawnFailed(String),
    /// It exited with a non-zero code.
    Exit(i32),
    /// A signal ended it.
    Signal(String),
    /// SIGKILL that the orchestrator did not send: most likely the kernel's OOM killer.
    KilledExternally,
    /// It ran past its timeout and was stopped.
    Timeout(Duration),
    /// It made no progress for its stall window and was stopped: what it was doing.
    Hung(String),
    /// One of its ranks ended badly (which, and how); the rest of the stage was stopped after
    /// its `rank_grace`, or ended on its own (`then`: how the first process ended).
    RankFailed {
        /// The rank and its exit.
        rank: crate::attempt::ranks::RankExit,
        /// What came of the rest of the stage.
        then: String,
    },
    /// The device ran out of memory.
    CudaOutOfMemory(String),
    /// The kernel's OOM killer ended processes of the stage's cgroup: it reached its `memory`.
    OomKilled {
        /// Processes killed.
        kills: u64,
        /// The cgroup's peak memory, bytes.
        peak: Option<u64>,
        /// Its limit, bytes.
        limit: Option<u64>,
    },
    /// The stage reported a failure (exit code, its message).
    Reported(i32, String),
    /// Its inputs were unusable (missing or corrupt checkpoint, bad data or params).
    BadInput(String),
    /// It contradicted the protocol (e.g. reported failure and exited 0).
    ProtocolViolation(String),
    /// It exited 0 without its declared outputs.
    MissingOutputs(Vec<String>),
    /// Its outputs did not verify.
    CorruptOutput(String),
}

impl Failure {
    /// One sentence for the console and the report.
    pub fn describe(&self) -> String {
        match self {
            Failure::SpawnFailed(why) => format!("could not start: {why}"),
            Failure::Exit(code) => format!("exited with code {code}"),
            Failure::Signal(name) => format!("killed by {name}"),
            Failure::KilledExternally => "killed by SIGKILL that orchestrate did not send (most likely the kernel's out-of-memory killer: check `dmesg`)".into(),
            Failure::Timeout(d) => format!("timed out after {}", protocol::duration::HumanDuration(*d)),
            Failure::Hung(what) => format!("hung: {what}"),
            Failure::RankFailed { rank, then } => format!("{}; {then}", rank.describe()),
            Failure::CudaOutOfMemory(msg) => format!("CUDA out of memory: {msg}"),
            Failure::OomKilled { kills, peak, limit } => {
                let size = |b: &Option<u64>| b.map_or("unknown".to_string(), |b| protocol::bytesize::ByteSize(b).to_string());
                format!("killed by the kernel's OOM killer ({kills} process(es)): host memory reached its limit of {} (peak {})", size(limit), size(peak))
            }
            Failure::Reported(code, msg) => format!("exited with code {code}: {msg}"),
            Failure::BadInput(msg) => format!("bad input: {msg}"),
            Failure::ProtocolViolation(msg) => format!("protocol violation: {msg}"),
            Failure::MissingOutputs(files) => format!("exited 0 but its declared outputs are missing: {}", files.join(", ")),
            Failure::CorruptOutput(msg) => format!("its outputs do not verify: {msg}"),
        }
    }

    /// A short machine-readable class for the report.
    pub fn class(&self) -> protocol::status::FailureClass {
        use protocol::status::FailureClass as C;
        match self {
            Failure::SpawnFailed(_) => C::SpawnFailed,
            Failure::Exit(_) => C::ExitCode,
            Failure::Signal(_) => C::Signal,
            Failure::KilledExternally => C::KilledExternally,
            Failure::Timeout(_) => C::Timeout,
            Failure::Hung(_) => C::Hung,
            Failure::RankFailed { .. } => C::RankFailed,
            Failure::CudaOutOfMemory(_) => C::CudaOom,
            Failure::OomKilled { .. } => C::OomKilled,
            Failure::Reported(..) => C::Reported,
            Failure::BadInput(_) => C::BadInput,
            Failure::ProtocolViolation(_) => C::ProtocolViolation,
            Failure::MissingOutputs(_) => C::MissingOutputs,
            Failure::CorruptOutput(_) => C::CorruptOutput,
        }
    }

    /// Whether another attempt could succeed (a retry is pointless for bad input, a missing
    /// program or missing outputs, and for a host OOM kill unless the stage sets
    /// `retry_oom`: it would reach its limit again).
    pub fn retryable(&self, retry_oom: bool) -> bool {
        match self {
            Failure::OomKilled { .. } => retry_oom,
            other => !matches!(
                other,
                Failure::SpawnFailed(_) | Failure::BadInput(_) | Failure::MissingOutputs(_)
            ),
        }
    }
}

impl Failure {
    /// Whether `cause` (a `retry_on` entry) names this failure; `xid`: an XID hit one of the
    /// attempt's GPUs; `lost`: the attempt was lost with its Slurm node.
    pub fn matches(&self, cause: &protocol::plan::RetryCause, xid: bool, lost: bool) -> bool {
        use protocol::plan::RetryCause as R;
        match cause {
            R::Class(class) => self.class() == *class,
            R::Xid => xid,
            R::Lost => lost,
            R::Exit(code) => match self {
                Failure::Exit(c) | Failure::Reported(c, _) => c == code,
                Failure::Signal(_) | Failure::KilledExternally => {
                    self.signal_number().is_some_and(|sig| sig + 128 == *code)
                }
                _ => false,
            },
        }
    }

    fn signal_number(&self) -> Option<i32> {
        match self {
            Failure::KilledExternally => Some(libc::SIGKILL),
            Failure::Signal(name) => {
                (1..32).find(|&s| crate::process::tree::signal_name(s) == *name)
            }
            _ => None,
        }
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Exit 0, outputs verified.
    Succeeded,
    /// See the failure.
    Failed(Failure),
    /// Stopped because the run was stopped.
    Cancelled,
}

/// Everything known about a finished attempt.
#[derive(Debug, Clone)]
pub struct AttemptResult {
    /// How it ended.
    pub outcome: Outcome,
    /// The first process's exit status.
    pub exit: Option<ExitStatus>,
    /// Wall time from spawn to the last process gone.
    pub wall: Duration,
    /// Verified outputs.
    pub checkpoints: Vec<CheckpointRecord>,
    /// The last metrics reported.
    pub metrics: BTreeMap<String, f64>,
    /// Per-GPU verification.
    pub gpu: Vec<GpuRecord>,
    /// Processes that outlived the first process and had to be stopped.
    pub leftovers: Vec<StoppedProcess>,
    /// Malformed messages received.
    pub violations: Vec<String>,
    /// Last lines of stderr, when it failed.
    pub stderr_tail: Option<String>,
    /// Milestones (absent for an attempt that never started).
    pub timing: Option<protocol::report::StageTiming>,
    /// CPU time and memory of the stage's processes.
    pub host: Option<protocol::report::HostUsage>,
    /// Stages with `preload`: forked from the zygote, or exec'd and why.
    pub start: Option<protocol::report::StageStart>,
    /// It was started early, ahead of an upstream stage still persisting its outputs (the
    /// run loop, which started it, says so).
    pub started_early: bool,
    /// The highest step it reported (progress events), if it reported any.
    pub last_step: Option<u64>,
    /// The Slurm node it was lost with (a placed step; the run loop says so).
    pub lost_on: Option<String>,
}

impl AttemptResult {
    /// The result of an attempt that never started.
    pub fn early_failure(failure: Failure) -> AttemptResult {
        AttemptResult {
            outcome: Outcome::Failed(failure),
            exit: None,
            wall: Duration::ZERO,
            checkpoints: Vec::new(),
            metrics: BTreeMap::new(),
            gpu: Vec::new(),
            leftovers: Vec::new(),
            violations: Vec::new(),
            stderr_tail: None,
            timing: None,
            host: None,
            start: None,
            started_early: false,
            last_step: None,
            lost_on: None,
        }
    }
}
