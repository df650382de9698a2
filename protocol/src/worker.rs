//! The contract between the orchestrator and the processes of a stage.
//!
//! Every stage, built-in or arbitrary command, gets the environment variables named here. Any
//! process of the stage's tree (rank 0 under a launcher, a grandchild, a program in another
//! language) may report [`WorkerEvent`]s: it connects to the Unix stream socket named by
//! [`ENV_EVENTS`] and writes one JSON object per line, each with `"v": 1` and an `"event"`
//! field. Python needs only the standard library:
//!
//! ```python
//! import json, os, socket
//! s = socket.socket(socket.AF_UNIX); s.connect(os.environ["ORCHESTRATE_EVENTS"])
//! s.sendall((json.dumps({"v": 1, "event": "progress", "step": 10, "loss": 2.5}) + "\n").encode())
//! ```
//!
//! Events are optional: a command stage succeeds by exiting 0 with its declared outputs present.

use crate::plan::BuiltinKind;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The stage's name.
pub const ENV_STAGE: &str = "ORCHESTRATE_STAGE";
/// The run directory.
pub const ENV_RUN_DIR: &str = "ORCHESTRATE_RUN_DIR";
/// The directory the stage writes its outputs to (created before the stage starts).
pub const ENV_OUTPUT_DIR: &str = "ORCHESTRATE_OUTPUT_DIR";
/// Path of the Unix socket that takes the stage's JSON-lines events.
pub const ENV_EVENTS: &str = "ORCHESTRATE_EVENTS";
/// Which attempt of the stage this is, counting from 1.
pub const ENV_ATTEMPT: &str = "ORCHESTRATE_ATTEMPT";
/// Set when the stage's output directory already holds what an earlier attempt of the same
/// stage wrote (a retry, or a resumed run after an interruption): the directory to resume from.
/// Equal to [`ENV_OUTPUT_DIR`]; absent on a first, clean start.
pub const ENV_RESUME_DIR: &str = "ORCHESTRATE_RESUME_DIR";
/// Path of the [`StageSpec`] JSON file (built-in stages; present for commands too).
pub const ENV_SPEC: &str = "ORCHESTRATE_SPEC";
/// Prefix of the per-upstream variables; see [`crate::plan::input_env_var`].
pub const ENV_INPUT_PREFIX: &str = "ORCHESTRATE_INPUT_";
/// Path of `inputs.json`: a JSON object, upstream stage name → its output directory. Always
/// set; the only way to find the inputs of a stage with more than [`MAX_INPUT_VARS`] of them.
pub const ENV_INPUTS_FILE: &str = "ORCHESTRATE_INPUTS_FILE";
/// The variables that carry a stage attempt's rendezvous port: a port of its own, so that two
/// multi-process stages side by side do not both take the launchers' default (29500). A plan
/// that sets `MASTER_PORT` keeps its own.
pub const ENV_PORT_VARS: [&str; 2] = ["MASTER_PORT", "PET_MASTER_PORT"];
/// The variables that name a stage attempt's own files for PyTorch's NCCL flight recorder
/// (where a rank dumps its trace, and the FIFO that asks for the dump): set per attempt for a
/// command stage with GPUs, so, like the port, never part of what stages share (a zygote's key).
pub const ENV_FLIGHT_RECORDER_FILES: [&str; 2] = [
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
];
/// A stage with more upstream stages than this gets no `ORCHESTRATE_INPUT_<X>` variables (an
/// aggregate after a 10,000-instance matrix would exceed the kernel's limit on a new process's
/// environment): it reads [`ENV_INPUTS_FILE`] instead.
pub const MAX_INPUT_VARS: usize = 64;

/// Everything a worker needs to run one stage, written as `spec.json` in the stage directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StageSpec {
    /// Protocol version ([`crate::PROTOCOL_VERSION`]).
    pub v: u32,
    /// The stage's name.
    pub stage: String,
    /// The built-in task, for `stage-worker`; `None` for command stages.
    pub kind: Option<BuiltinKind>,
    /// The stage's `params` table from the plan.
    pub params: serde_json::Map<String, serde_json::Value>,
    /// Where the stage writes its outputs.
    pub output_dir: PathBuf,
    /// Each upstream stage's output directory, by stage name.
    pub inputs: BTreeMap<String, PathBuf>,
    /// The output directory of the stage named by `init`, whose checkpoint the stage starts from.
    pub init: Option<PathBuf>,
    /// `"cuda"` when the stage was given GPUs, else `"cpu"`.
    pub device: Device,
    /// The attempt number, from 1.
    pub attempt: u32,
    /// Output directories (among `inputs` and `init`) whose checkpoint may still be being
    /// written: the stage was started early, while its upstream stage persists its outputs
    /// (its GPU was handed on at its release). A worker reads such a directory only once its
    /// `manifest.json` is present (written last, after every file it lists is complete), and
    /// then verifies it as any input. Empty (and absent from the JSON) for an ordinary start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs_being_written: Vec<PathBuf>,
    /// The longest a worker waits for those inputs, in seconds (the stage's timeout); none:
    /// until it is stopped (the orchestrator stops it if the upstream stage fails).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_wait_limit_s: Option<f64>,
}

/// Where a built-in stage computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// The host CPU.
    Cpu,
    /// The GPUs in `CUDA_VISIBLE_DEVICES`.
    Cuda,
}

/// One line on the event channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkerMessage {
    /// Protocol version ([`crate::PROTOCOL_VERSION`]).
    pub v: u32,
    /// What happened.
    #[serde(flatten)]
    pub event: WorkerEvent,
}

/// What a stage's process reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WorkerEvent {
    /// The stage's work began (after start-up: libraries loaded, device ready).
    Started {
        /// The reporting process.
        #[serde(default)]
        pid: Option<u32>,
        /// Device description, such as "cuda:NVIDIA H200" or "cpu".
        #[serde(default)]
        device: Option<String>,
    },
    /// Training or evaluation progress.
    Progress {
        /// Steps done.
        step: u64,
        /// Steps planned, when known.
        #[serde(default)]
        total_steps: Option<u64>,
        /// Latest loss.
        #[serde(default)]
        loss: Option<f64>,
        /// Throughput over the last interval.
        #[serde(default)]
        tokens_per_s: Option<f64>,
    },
    /// A checkpoint was written completely (renamed into place, fsynced).
    Checkpoint {
        /// Path of the checkpoint file or directory.
        path: PathBuf,
        /// SHA-256 of the file (hex), when the path is a file and the writer hashed it with
        /// SHA-256 (the Python client does).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sha256: Option<String>,
        /// BLAKE3 of the file (hex), when the path is a file and the writer hashed it with
        /// BLAKE3 (`stage-worker` does). With both, BLAKE3 is the one used.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        blake3: Option<String>,
        /// Size in bytes.
        #[serde(default)]
        bytes: Option<u64>,
        /// Training step it holds.
        #[serde(default)]
        step: Option<u64>,
        /// The file's identity once it was in place, when the path is a file: lets the
        /// orchestrator accept the checksum for it without reading the file again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        identity: Option<crate::checkpoint::FileIdentity>,
    },
    /// Final (or intermediate) named figures: loss, perplexity, accuracy, tokens/s.
    Metrics {
        /// Name → value.
        metrics: BTreeMap<String, f64>,
    },
    /// The stage's device work ends in a moment: its last step is done and its final
    /// checkpoint is being copied off the device; a `released` follows unless that fails.
    /// `orchestrate` may prepare the next stage's process meanwhile (a fork server's
    /// standby, which initialises the CUDA driver but creates no context). Sent at most once.
    Finishing {},
    /// The stage's device work is over: every CUDA context of its processes is destroyed, so
    /// NVML lists none of them and the memory is back. Sent once, as early as that is true (a
    /// training stage: as soon as its final checkpoint is on the host, while the disk still
    /// writes). `orchestrate` then checks the stage's GPUs at once and, if they are back, hands
    /// them to the next stage before this one exits; a process of the stage that touches a GPU
    /// again afterwards is a leak. A release that does not hold yet changes nothing (it may be
    /// sent again).
    Released {
        /// The reporting process.
        #[serde(default)]
        pid: Option<u32>,
        /// The stage writes its outputs the checkpoint way (every file put in place whole,
        /// `manifest.json` last, listing them with their checksums), so a downstream stage may
        /// start now and read them once the manifest is there (`stage-worker`'s train stage
        /// says so; a command stage opts in). Its finish is recorded only after this stage's.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        downstream_may_start: bool,
    },
    /// The work finished; the process is about to exit 0.
    Done {},
    /// The work failed; the process is about to exit non-zero.
    Failed {
        /// What went wrong, for the user.
        error: String,
        /// A machine-readable class, such as "cuda_oom", "bad_input", "interrupted".
        #[serde(default)]
        reason: Option<String>,
    },
}

/// Exit status of a built-in worker that stopped on SIGTERM after saving what it could.
pub const EXIT_INTERRUPTED: i32 = 75;
/// Exit status of a built-in worker whose inputs or parameters were unusable.
pub const EXIT_BAD_INPUT: i32 = 65;
/// Exit status of a built-in worker that ran out of device memory.
pub const EXIT_OUT_OF_MEMORY: i32 = 66;

/// Parameters of a built-in `train` stage (the stage's `params` table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TrainParams {
    /// `"synthetic:pretrain"`, `"synthetic:sft"`, a text file or a JSONL prompt/completion file.
    pub data: String,
    /// Optimizer steps.
    pub steps: u64,
    /// Sequences per step.
    pub batch_size: u32,
    /// Tokens (bytes) per sequence.
    pub seq_len: u32,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps before cosine decay.
    pub warmup_steps: u64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// Seed of initialisation and data order.
    pub seed: u64,
    /// Seconds between progress events.
    pub progress_every_s: f64,
    /// Model shape, for a stage trained from scratch (a stage with `init` takes its parent's).
    pub model: ModelConfig,
    /// `"auto"` (bf16 on GPU, fp32 on CPU), `"bf16"` or `"fp32"`.
    pub precision: String,
    /// Write a resumable checkpoint every this many steps (0: only at the end and on SIGTERM),
    /// so that a crash loses at most this many steps.
    pub checkpoint_every: u64,
}

impl Default for TrainParams {
    fn default() -> Self {
        TrainParams {
            data: "synthetic:pretrain".into(),
            steps: 200,
            batch_size: 16,
            seq_len: 64,
            lr: 3e-3,
            warmup_steps: 20,
            weight_decay: 0.01,
            seed: 0,
            progress_every_s: 1.0,
            model: ModelConfig::default(),
            precision: "auto".into(),
            checkpoint_every: 0,
        }
    }
}

/// Parameters of a built-in `eval` stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EvalParams {
    /// Same forms as [`TrainParams::data`].
    pub data: String,
    /// Examples evaluated (prompt/completion data) or sequences scored (text).
    pub samples: u32,
    /// Sequences per forward pass.
    pub batch_size: u32,
    /// Tokens per sequence for loss.
    pub seq_len: u32,
    /// Seed of the synthetic held-out set.
    pub seed: u64,
    /// `"auto"`, `"bf16"` or `"fp32"`.
    pub precision: String,
}

impl Default for EvalParams {
    fn default() -> Self {
        EvalParams {
            data: "synthetic:sft".into(),
            samples: 200,
            batch_size: 64,
            seq_len: 64,
            seed: 1_000_003,
            precision: "auto".into(),
        }
    }
}

/// Shape of the byte-level decoder-only transformer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Width of the residual stream.
    pub d_model: i64,
    /// Transformer blocks.
    pub n_layers: i64,
    /// Attention heads (must divide `d_model`).
    pub n_heads: i64,
    /// Longest sequence the position table covers.
    pub max_seq_len: i64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            d_model: 128,
            n_layers: 2,
            n_heads: 4,
            max_seq_len: 256,
        }
    }
}
