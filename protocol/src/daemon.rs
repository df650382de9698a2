//! The daemon's socket protocol: newline-delimited JSON over a Unix stream socket.
//!
//! On connect the daemon sends one [`Response::Hello`] line. Every request is one JSON object
//! on one line with `"v": 1` and a `"type"`; every answer is one line (a `watch` streams
//! several, ending with [`Response::Finished`]). A request the daemon cannot take (malformed
//! JSON, an unknown type, a wrong version, a line over [`MAX_REQUEST_BYTES`]) gets an
//! [`Response::Error`] naming the problem; the connection and the daemon go on (except after
//! an over-long line, where the connection is closed because the stream cannot be resynced).
//! `docs/protocol.md` has every message with an example.

use serde::{Deserialize, Serialize};

/// Version of this protocol; requests carry it in `v`.
pub const DAEMON_PROTOCOL_VERSION: u32 = 1;

/// Longest request line the daemon reads (a plan sent inline must fit; send a `path` for
/// bigger plans).
pub const MAX_REQUEST_BYTES: usize = 8 << 20;
/// The most bytes of unfinished request lines the daemon holds for all its connections
/// together; a connection whose bytes would go over it gets a `too_large` error and is closed.
pub const MAX_BUFFERED_REQUEST_BYTES: usize = 64 << 20;

/// A client's request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Run a plan.
    Submit {
        /// Protocol version.
        v: u32,
        /// The plan.
        plan: PlanInput,
        /// Directory the plan's relative paths mean, for an inline plan (default: the
        /// daemon's working directory; a `path` plan is based at its own directory).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base_dir: Option<String>,
        /// A client-chosen id: a second submit with the same id returns the first run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_id: Option<String>,
        /// Higher runs first when stages wait for GPUs (default 0).
        #[serde(default)]
        priority: i32,
    },
    /// One run's state, or every run's.
    Status {
        /// Protocol version.
        v: u32,
        /// The run (all runs when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
    },
    /// Every run the daemon knows, newest last.
    List {
        /// Protocol version.
        v: u32,
    },
    /// A run's events from `from` (0: its start), then live, ending with its outcome.
    Watch {
        /// Protocol version.
        v: u32,
        /// The run.
        id: String,
        /// First event sequence number to send.
        #[serde(default)]
        from: u64,
    },
    /// Answers once the run has finished, with its outcome.
    Wait {
        /// Protocol version.
        v: u32,
        /// The run.
        id: String,
    },
    /// Stops a run: running stages get SIGTERM and their grace (`kill`: SIGKILL now).
    Cancel {
        /// Protocol version.
        v: u32,
        /// The run.
        id: String,
        /// Kill at once instead of a graceful stop.
        #[serde(default)]
        kill: bool,
    },
    /// Stops the daemon: `drain` lets running runs finish (no new submissions), `cancel`
    /// stops them gracefully first.
    Shutdown {
        /// Protocol version.
        v: u32,
        /// How.
        #[serde(default)]
        mode: ShutdownMode,
    },
    /// Gives a quarantined GPU back to stages, once the driver shows it empty (no process,
    /// memory at its idle baseline); refused, naming the holder, otherwise.
    ReleaseGpu {
        /// Protocol version.
        v: u32,
        /// The GPU: its NVML index ("0") or its UUID (or a unique prefix of it).
        gpu: String,
    },
}

impl Request {
    /// The version the request declares.
    pub fn version(&self) -> u32 {
        match self {
            Request::Submit { v, .. }
            | Request::Status { v, .. }
            | Request::List { v }
            | Request::Watch { v, .. }
            | Request::Wait { v, .. }
            | Request::Cancel { v, .. }
            | Request::Shutdown { v, .. }
            | Request::ReleaseGpu { v, .. } => *v,
        }
    }
}

/// A plan as a client sends it: TOML text, a JSON object, or a path the daemon reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum PlanInput {
    /// TOML text.
    Toml(String),
    /// The plan as a JSON object.
    Json(serde_json::Value),
    /// A plan file (TOML, or JSON by extension), absolute or relative to the daemon's
    /// working directory.
    Path(String),
}

/// How [`Request::Shutdown`] treats running runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShutdownMode {
    /// Let them finish.
    #[default]
    Drain,
    /// Stop them gracefully, then exit.
    Cancel,
}

/// The daemon's answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    /// Sent once, on connect.
    Hello {
        /// Protocol version of the daemon.
        v: u32,
        /// `orchestrate` version.
        server: String,
        /// The daemon's pid.
        pid: u32,
    },
    /// A run was accepted (or, with a known `client_id`, found).
    Submitted {
        /// Protocol version.
        v: u32,
        /// The run's id.
        id: String,
        /// Its directory.
        run_dir: String,
        /// Whether the run already existed (an idempotent resubmit).
        existing: bool,
    },
    /// Runs and their states.
    Runs {
        /// Protocol version.
        v: u32,
        /// The runs asked for.
        runs: Vec<RunInfo>,
    },
    /// One event of a watched run.
    Event {
        /// Protocol version.
        v: u32,
        /// The run.
        id: String,
        /// Its sequence number in the run (from 0, no gaps).
        seq: u64,
        /// The event.
        event: RunEvent,
    },
    /// The run has finished: the end of a `watch`, the answer to a `wait`.
    Finished {
        /// Protocol version.
        v: u32,
        /// The run.
        id: String,
        /// How it ended.
        run: RunInfo,
    },
    /// A cancel was passed on to the run.
    Cancelling {
        /// Protocol version.
        v: u32,
        /// The run.
        id: String,
    },
    /// The daemon is shutting down.
    ShuttingDown {
        /// Protocol version.
        v: u32,
        /// Runs still running.
        running: usize,
    },
    /// A quarantined GPU was given back to stages.
    GpuReleased {
        /// Protocol version.
        v: u32,
        /// Its NVML index.
        index: u32,
        /// Its UUID.
        uuid: String,
    },
    /// The request could not be served.
    Error {
        /// Protocol version.
        v: u32,
        /// What kind of problem.
        code: ErrorCode,
        /// What is wrong, for a human.
        error: String,
    },
}

/// The kinds of [`Response::Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Not JSON, or not a request object.
    Malformed,
    /// An unknown `type`.
    UnknownType,
    /// A `v` this daemon does not speak.
    Version,
    /// The line is longer than [`MAX_REQUEST_BYTES`], or the daemon holds
    /// [`MAX_BUFFERED_REQUEST_BYTES`] of unfinished lines in all.
    TooLarge,
    /// The plan does not validate.
    InvalidPlan,
    /// The plan validates but cannot run on this host (GPUs it requires, a Slurm allocation
    /// its stages need); checked before the run is accepted. Also a `release_gpu` of a GPU
    /// that is not quarantined or that something still holds (the error names it).
    Refused,
    /// No run with that id (or, for `release_gpu`, no GPU of that index or UUID).
    NotFound,
    /// The run has already ended (a `cancel` of it has nothing to stop).
    AlreadyFinished,
    /// The daemon is shutting down and takes no new runs.
    ShuttingDown,
    /// The peer's user may not use this daemon.
    PermissionDenied,
    /// Anything else (I/O).
    Internal,
    /// A code this client does not know (sent by a newer daemon).
    #[serde(other)]
    Unknown,
}

/// A run as the daemon sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Its id.
    pub id: String,
    /// Its directory.
    pub run_dir: String,
    /// "queued", "running", "succeeded", "succeeded_leaked", "failed", "leaked", "interrupted".
    pub state: crate::status::RunStatus,
    /// `orchestrate`'s exit status for it, once finished.
    pub exit_code: Option<i32>,
    /// The client's id for it.
    #[serde(default)]
    pub client_id: Option<String>,
    /// Its priority.
    #[serde(default)]
    pub priority: i32,
    /// When it was submitted (Unix seconds).
    pub submitted_unix: f64,
    /// When it finished.
    pub finished_unix: Option<f64>,
    /// Stages in the plan.
    pub stages: usize,
    /// Stages that succeeded.
    pub succeeded: usize,
    /// Stages running now.
    pub running: usize,
    /// Why its stages are waiting, when they are ("waiting: GPU 1 held by pid 4242 …").
    #[serde(default)]
    pub waiting: Vec<String>,
    /// Events so far (the next `watch` sequence number).
    pub events: u64,
}

/// Something that happened in a run: what the console prints, what watchers receive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEvent {
    /// Unix time, milliseconds.
    pub t_ms: u64,
    /// What.
    #[serde(flatten)]
    pub kind: RunEventKind,
}

/// The kinds of [`RunEvent`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RunEventKind {
    /// A general note.
    Note {
        /// Text.
        text: String,
    },
    /// A warning.
    Warning {
        /// Text.
        text: String,
    },
    /// A stage attempt started.
    StageStarted {
        /// Stage.
        stage: String,
        /// Attempt, from 1.
        attempt: u32,
        /// Its first process.
        pid: i32,
        /// "cpu" or the GPUs.
        placement: String,
    },
    /// A stage's progress (rate-limited).
    Progress {
        /// Stage.
        stage: String,
        /// Step.
        step: u64,
        /// Total steps.
        total: Option<u64>,
        /// Loss.
        loss: Option<f64>,
        /// Tokens per second.
        tokens_per_s: Option<f64>,
    },
    /// A stage waits for GPUs, and why.
    StageWaiting {
        /// Stage.
        stage: String,
        /// Why.
        reason: String,
    },
    /// A stage attempt ended.
    StageFinished {
        /// Stage.
        stage: String,
        /// "succeeded", "failed", "cancelled".
        status: crate::status::StageStatus,
        /// Details (the error).
        detail: String,
        /// Wall time, seconds.
        wall_s: f64,
    },
    /// A block of text (a results table, the final summary).
    Text {
        /// Text.
        text: String,
    },
    /// The run ended.
    RunFinished {
        /// "succeeded", "succeeded_leaked", "failed", "leaked", "interrupted".
        status: crate::status::RunStatus,
        /// `orchestrate`'s exit status.
        exit_code: i32,
    },
    /// A stage's attempt failed and the stage will be tried again (after its
    /// `stage_finished`).
    StageRetrying {
        /// Stage.
        stage: String,
        /// The attempt that failed, from 1.
        attempt: u32,
        /// Why it failed.
        error: String,
        /// Seconds until the next attempt starts.
        retry_in_s: f64,
    },
    /// A stage will not run.
    StageSkipped {
        /// Stage.
        stage: String,
        /// Why, as a class (`upstream_failed`, `interrupted`, `fail_fast`, `gpu_leaked`).
        class: crate::status::FailureClass,
        /// Why, for a human.
        reason: String,
    },
    /// A GPU's memory did not come back to its baseline after a stage's processes were gone.
    GpuNotReclaimed {
        /// The stage.
        stage: String,
        /// The GPU.
        uuid: String,
        /// `leaked`, or `taken_by_other` (held by processes outside the stage's tree).
        verdict: crate::report::GpuVerdict,
        /// Used bytes before the stage.
        baseline_bytes: u64,
        /// Used bytes when the wait for reclaim ended.
        after_bytes: u64,
        /// How long the wait for reclaim lasted, milliseconds.
        reclaim_ms: f64,
        /// The processes holding it, as "pid N (name)".
        holders: Vec<String>,
        /// Why a leak is a leak where that is not obvious.
        note: Option<String>,
    },
    /// The kernel's OOM killer ended a process of a stage's cgroup: the stage used all the
    /// host memory its `memory` limit allows (it fails `oom_killed`).
    StageOomKilled {
        /// The stage.
        stage: String,
        /// The attempt, from 1.
        attempt: u32,
        /// Processes the OOM killer ended (`memory.events` `oom_kill`).
        oom_kills: u64,
        /// The cgroup's highest memory use (`memory.peak`), bytes, where the kernel says.
        peak_bytes: Option<u64>,
        /// Its `memory.max`, bytes, if set.
        limit_bytes: Option<u64>,
    },
    /// No further stage runs on this GPU (`on_leak = "quarantine"`).
    GpuQuarantined {
        /// The GPU.
        uuid: String,
    },
    /// The run starts no further stage; the running ones end as they were going to (or as
    /// the cancel that stopped the run says).
    RunStopping {
        /// Why: `interrupted`, `fail_fast` or `gpu_leaked`.
        reason: crate::status::FailureClass,
    },
    /// A stage attempt's GPU verdicts, one record per GPU it had (clean ones included), once
    /// its tree is gone and every GPU judged: baseline, peak, after, reclaim time, holders.
    StageGpu {
        /// The stage.
        stage: String,
        /// The attempt, from 1.
        attempt: u32,
        /// One record per GPU, as `report.json` has them.
        gpus: Vec<crate::report::GpuRecord>,
    },
    /// An event this client does not know (sent by a newer `orchestrate`): skip it.
    #[serde(other)]
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_or_error_code_from_a_newer_peer_reads_as_unknown() {
        let event: RunEvent =
            serde_json::from_str(r#"{"t_ms":1,"event":"stage_teleported","stage":"a"}"#).unwrap();
        assert_eq!(event.kind, RunEventKind::Unknown);
        let code: ErrorCode = serde_json::from_str(r#""quota_exceeded""#).unwrap();
        assert_eq!(code, ErrorCode::Unknown);
    }

    #[test]
    fn typed_events_keep_their_fields() {
        let skipped = RunEvent {
            t_ms: 5,
            kind: RunEventKind::StageSkipped {
                stage: "b".into(),
                class: crate::status::FailureClass::UpstreamFailed,
                reason: "upstream stage `a` did not succeed".into(),
            },
        };
        let text = serde_json::to_string(&skipped).unwrap();
        assert!(text.contains(r#""event":"stage_skipped""#), "{text}");
        assert!(text.contains(r#""class":"upstream_failed""#), "{text}");
        assert_eq!(serde_json::from_str::<RunEvent>(&text).unwrap(), skipped);
    }
}
