//! The plan: a pipeline of stages, written by users in TOML or submitted by programs as JSON.
//!
//! The field names here are the plan format; `docs/plan-format.md` documents each one with a
//! full example, and `orchestrate schema` prints the JSON Schema generated from these types.

use crate::bytesize::ByteSize;
use crate::duration::{HumanDuration, StallTimeout};
pub use crate::preload::Preload;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// A whole pipeline: run-wide settings and the stages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Run-wide settings (all optional).
    #[serde(default)]
    pub run: RunSettings,
    /// The stages, in any order; `after` gives the order that matters.
    #[serde(default, rename = "stage")]
    pub stages: Vec<Stage>,
}

/// Settings that apply to the whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunSettings {
    /// A name for the run, used in the run directory's name.
    #[serde(default)]
    pub name: Option<String>,
    /// At most this many stages run at the same time (default: the number of CPUs).
    #[serde(default)]
    pub max_parallel: Option<u32>,
    /// How long a stage has between SIGTERM and SIGKILL when stopped (default "10s").
    #[serde(default = "default_grace")]
    pub grace: HumanDuration,
    /// Whether GPU memory is verified after every stage (default "auto").
    #[serde(default)]
    pub gpu_check: GpuCheck,
    /// Memory above the baseline that still counts as clean, in MiB (default 64).
    #[serde(default = "default_tolerance_mib")]
    pub gpu_tolerance_mib: u64,
    /// How long to wait for a GPU to come back to its baseline after a stage (default "10s").
    #[serde(default = "default_reclaim_timeout")]
    pub reclaim_timeout: HumanDuration,
    /// What a leak verdict does (default "fail").
    #[serde(default)]
    pub on_leak: OnLeak,
    /// Stop starting stages after the first stage fails for good (default false: independent
    /// stages, such as the other instances of a matrix, run to their end).
    #[serde(default)]
    pub fail_fast: bool,
    /// Path of the `stage-worker` binary for built-in stages (default: beside `orchestrate`).
    #[serde(default)]
    pub worker: Option<String>,
    /// How a stage's GPUs are named in `CUDA_VISIBLE_DEVICES` (default "index").
    #[serde(default)]
    pub cuda_visible_devices: VisibleDevices,
    /// Modules every Python command stage (`python SCRIPT` / `python -m MODULE`) gets
    /// preloaded: it is forked from a zygote that imported them, or `"auto"`, a zygote that
    /// learns them from its stages (default none: exec'd).
    #[serde(default, skip_serializing_if = "Preload::is_off")]
    pub preload: Preload,
    /// How stages that share a GPU (`gpu_memory`) share it: `"time_slice"` (default: the
    /// driver gives each process its turn) or `"mps"` (orchestrate runs an NVIDIA MPS control
    /// daemon of its own for each such GPU while stages share it; see `docs/plan-format.md`).
    #[serde(default, skip_serializing_if = "GpuSharing::is_default")]
    pub gpu_sharing: GpuSharing,
    /// Judge a stage hung after this long without progress, or "off" (default: 30 minutes,
    /// and only for stages that have reported progress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_timeout: Option<StallTimeout>,
    /// After a rank of a multi-process stage exits non-zero, how long its peers may go on
    /// before they are stopped (default "30s").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_grace: Option<HumanDuration>,
    /// The failures that are retried (up to a stage's `retries`); default: every failure but
    /// bad input, a program that cannot start, missing outputs and `oom_killed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<Vec<RetryCause>>,
    /// Experiment tracking: "mlflow" logs the run, and each stage as a nested run, to an MLflow
    /// server when the run ends (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<Tracking>,
    /// The tracking server, `http://host:port` (default: `$MLFLOW_TRACKING_URI`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking_uri: Option<String>,
    /// The experiment runs are logged under (default: `$MLFLOW_EXPERIMENT_NAME`, else the
    /// run's `name`, else "orchestrate").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<String>,
}

/// An experiment tracker a run is logged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Tracking {
    /// An MLflow tracking server (its REST API).
    Mlflow,
}

fn default_grace() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_tolerance_mib() -> u64 {
    64
}
fn default_reclaim_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            name: None,
            max_parallel: None,
            grace: default_grace(),
            gpu_check: GpuCheck::default(),
            gpu_tolerance_mib: default_tolerance_mib(),
            reclaim_timeout: default_reclaim_timeout(),
            on_leak: OnLeak::default(),
            fail_fast: false,
            worker: None,
            cuda_visible_devices: VisibleDevices::default(),
            preload: Preload::default(),
            gpu_sharing: GpuSharing::default(),
            stall_timeout: None,
            rank_grace: None,
            retry_on: None,
            tracking: None,
            tracking_uri: None,
            experiment: None,
        }
    }
}

/// Whether the GPU memory check runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GpuCheck {
    /// Check when NVML is present; otherwise run and say the check was unavailable.
    #[default]
    Auto,
    /// Refuse to start without NVML.
    Required,
    /// Never check.
    Off,
}

/// How a stage's GPUs are named in its `CUDA_VISIBLE_DEVICES`. Their UUIDs are always in
/// `ORCHESTRATE_GPU_UUIDS` as well.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum VisibleDevices {
    /// CUDA indices in PCI bus order, with `CUDA_DEVICE_ORDER=PCI_BUS_ID`: what every
    /// framework parses (DeepSpeed, for one, accepts nothing else).
    #[default]
    Index,
    /// NVML UUIDs (`GPU-…`): unambiguous, and the only way to name MIG instances, but some
    /// frameworks cannot parse them.
    Uuid,
}

/// How stages that declared `gpu_memory` share their GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GpuSharing {
    /// Each stage is a process of its own on the GPU, and the driver gives them turns; each
    /// makes its own CUDA context, one after another.
    #[default]
    TimeSlice,
    /// The stages are clients of an MPS server (NVIDIA's Multi-Process Service) that
    /// orchestrate starts for the GPU while stages share it, and stops after: their kernels
    /// run side by side and their contexts start faster. A fatal GPU fault in one stage fails
    /// the others on that GPU too.
    Mps,
}

impl GpuSharing {
    /// Whether this is the default (left out of a serialized plan, so that plans that do not
    /// set it keep their hash).
    pub fn is_default(&self) -> bool {
        *self == GpuSharing::TimeSlice
    }
}

/// What a leak verdict does to the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnLeak {
    /// The run fails (exit code 3) once running stages finish.
    #[default]
    Fail,
    /// No further stage is placed on the leaking GPU; the run goes on elsewhere.
    Quarantine,
    /// Reported only.
    Warn,
}

/// One stage: a fresh process (tree) that consumes upstream outputs and produces its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// Unique name: letters, digits, `-`, `_` and `.`.
    pub name: String,
    /// Stages that must succeed before this one starts; their outputs become its inputs.
    #[serde(default)]
    pub after: Vec<String>,
    /// A built-in `stage-worker` task. Exactly one of `kind` and `command` is given.
    #[serde(default)]
    pub kind: Option<BuiltinKind>,
    /// Any program, as an argv list; `{output}` and `{input.X}` expand to paths.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Parameters of a built-in task (see `docs/plan-format.md`).
    #[serde(default)]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// Start from this upstream stage's checkpoint.
    #[serde(default)]
    pub init: Option<String>,
    /// Stop the stage (SIGTERM, grace, SIGKILL) after this long.
    #[serde(default)]
    pub timeout: Option<HumanDuration>,
    /// Judge the stage hung after this long without progress, or "off" (default: `[run]
    /// stall_timeout`; see `docs/plan-format.md`, "Hangs").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_timeout: Option<StallTimeout>,
    /// After one of its ranks exits non-zero, how long the others may go on before they are
    /// stopped (default: `[run] rank_grace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_grace: Option<HumanDuration>,
    /// The failures that are retried (default: `[run] retry_on`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<Vec<RetryCause>>,
    /// How many more attempts after a failed one (default 0).
    #[serde(default)]
    pub retries: u32,
    /// Whole GPUs the stage gets, exclusively (default 1 for built-in tasks, 0 for commands).
    #[serde(default)]
    pub gpus: Option<u32>,
    /// Extra environment variables for the stage's processes.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Files (relative to the output directory) a command stage must leave behind to succeed.
    #[serde(default)]
    pub outputs: Vec<String>,
    /// Fan-out: one instance of the stage per combination of these values (several keys give
    /// the product). Each instance is named `name[key=value,…]`, gets its own output
    /// directory, `{matrix.KEY}` in its command and string params, and
    /// `ORCHESTRATE_MATRIX_<KEY>` in its environment.
    #[serde(default)]
    pub matrix: BTreeMap<String, MatrixAxis>,
    /// Slurm: run the stage through `srun` on this many nodes of the allocation (default 1
    /// when `tasks_per_node` or `gpus_per_task` is given). Command stages only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// Slurm: tasks (processes) `srun` starts on each node (default 1); each gets `RANK`,
    /// `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_per_node: Option<u32>,
    /// Slurm: GPUs `srun` binds to each task (`--gpus-per-task`); Slurm, not the
    /// orchestrator, assigns them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_task: Option<u32>,
    /// A Python command stage: modules its zygote imports before forking it (replaces
    /// `[run] preload`; `"auto"` learns them; `[]` execs it). Command stages only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preload: Option<Preload>,
    /// Host memory the stage's processes may use together (cgroup v2 `memory.max`), such as
    /// `"64GiB"`; past it the kernel's OOM killer ends one of them and the stage fails
    /// `oom_killed`. Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    /// Most processes and threads the stage may have at once (cgroup v2 `pids.max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// CPUs' worth of time the stage may use (cgroup v2 `cpu.max`), such as `8` or `0.5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Retry (up to `retries`) an attempt the OOM killer ended (default false: it would run
    /// out of memory again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retry_oom: bool,
    /// GPU memory the stage needs, such as `"20GiB"`: the stage then takes a share of one GPU
    /// instead of a whole one, beside other sharing stages whose declarations fit in the GPU's
    /// memory (see `docs/plan-format.md`, "Sharing a GPU"). Default: whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory: Option<ByteSize>,
}

/// How a stage that runs through `srun` is laid out over the allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLayout {
    /// Nodes.
    pub nodes: u32,
    /// Tasks on each node.
    pub tasks_per_node: u32,
    /// GPUs bound to each task, when asked for.
    pub gpus_per_task: Option<u32>,
}

impl TaskLayout {
    /// Tasks in all.
    pub fn world_size(&self) -> u32 {
        self.nodes.saturating_mul(self.tasks_per_node)
    }
}

/// The values of one matrix key. A source table names exactly one source, `lines` or
/// `glob`, and nothing else.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum MatrixAxis {
    /// The values, written out.
    Values(Vec<MatrixValue>),
    /// One value per non-empty line of a file (lines starting with `#` skipped); the path is
    /// relative to the plan's directory.
    Lines {
        /// The file.
        lines: String,
    },
    /// One value per file matching a pattern (`*` and `?` in the last path component),
    /// relative to the plan's directory, in sorted order.
    Glob {
        /// The pattern.
        glob: String,
    },
}

impl<'de> Deserialize<'de> for MatrixAxis {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        /// What a matrix key's value may look like before its table is checked.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum MatrixAxisForm {
            Values(Vec<MatrixValue>),
            Table(BTreeMap<String, serde_json::Value>),
        }
        let table = match MatrixAxisForm::deserialize(deserializer)? {
            MatrixAxisForm::Values(values) => return Ok(MatrixAxis::Values(values)),
            MatrixAxisForm::Table(table) => table,
        };
        let mut keys = table.keys().map(String::as_str);
        let source = match (keys.next(), keys.next()) {
            (Some(key @ ("lines" | "glob")), None) => key,
            _ => {
                let found: Vec<String> = table.keys().map(|k| format!("`{k}`")).collect();
                return Err(D::Error::custom(format!(
                    "a matrix source table has exactly one key, `lines` (a file) or `glob` (a pattern); this one has {}",
                    if found.is_empty() { "none".to_string() } else { found.join(", ") }
                )));
            }
        };
        let Some(text) = table[source].as_str() else {
            return Err(D::Error::custom(format!(
                "`{source}` of a matrix source table is a string (a path or a pattern)"
            )));
        };
        Ok(match source {
            "lines" => MatrixAxis::Lines { lines: text.into() },
            _ => MatrixAxis::Glob { glob: text.into() },
        })
    }
}

/// One matrix value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum MatrixValue {
    /// A whole number.
    Int(i64),
    /// A number.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// Text.
    Text(String),
}

impl std::fmt::Display for MatrixValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MatrixValue::Int(v) => write!(f, "{v}"),
            MatrixValue::Float(v) => write!(f, "{v}"),
            MatrixValue::Bool(v) => write!(f, "{v}"),
            MatrixValue::Text(v) => f.write_str(v),
        }
    }
}

/// The tasks `stage-worker` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BuiltinKind {
    /// Train the byte-level language model, from scratch or from `init`.
    Train,
    /// Evaluate `init`'s checkpoint: loss, perplexity and, on prompt/completion data, accuracy.
    Eval,
}

impl BuiltinKind {
    /// The name used in plans.
    pub fn as_str(self) -> &'static str {
        match self {
            BuiltinKind::Train => "train",
            BuiltinKind::Eval => "eval",
        }
    }
}

impl Stage {
    /// GPUs the stage asks for, with the defaults applied.
    pub fn gpus_wanted(&self) -> u32 {
        let default = if self.kind.is_some() || self.gpu_memory.is_some() {
            1
        } else {
            0
        };
        self.gpus.unwrap_or(default)
    }

    /// The `srun` layout of a stage that sets `nodes`, `tasks_per_node` or `gpus_per_task`;
    /// `None` for a stage that runs as one local process tree.
    pub fn task_layout(&self) -> Option<TaskLayout> {
        if self.nodes.is_none() && self.tasks_per_node.is_none() && self.gpus_per_task.is_none() {
            return None;
        }
        Some(TaskLayout {
            nodes: self.nodes.unwrap_or(1),
            tasks_per_node: self.tasks_per_node.unwrap_or(1),
            gpus_per_task: self.gpus_per_task,
        })
    }

    /// The stage's timeout, if it has one.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout.map(HumanDuration::get)
    }
}

/// The variable name that carries stage `name`'s output directory to a command stage:
/// `ORCHESTRATE_INPUT_` followed by the name upper-cased, other characters replaced by `_`.
pub fn input_env_var(name: &str) -> String {
    const PREFIX: &str = "ORCHESTRATE_INPUT_";
    // One allocation: every character becomes one byte, and most names are ASCII.
    let mut var = String::with_capacity(PREFIX.len() + name.len());
    var.push_str(PREFIX);
    var.extend(name.chars().map(|c| {
        if c.is_ascii_alphanumeric() {
            c.to_ascii_uppercase()
        } else {
            '_'
        }
    }));
    var
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_variable_names_follow_the_contract() {
        assert_eq!(input_env_var("pretrain"), "ORCHESTRATE_INPUT_PRETRAIN");
        assert_eq!(input_env_var("sft-v2.b"), "ORCHESTRATE_INPUT_SFT_V2_B");
    }

    #[test]
    fn defaults_apply() {
        let plan: Plan = toml::from_str(
            "[[stage]]\nname = \"a\"\nkind = \"train\"\n[[stage]]\nname = \"b\"\ncommand = [\"true\"]\n",
        )
        .unwrap();
        assert_eq!(plan.stages[0].gpus_wanted(), 1);
        assert_eq!(plan.stages[1].gpus_wanted(), 0);
        assert_eq!(plan.run.grace.get(), Duration::from_secs(10));
        assert_eq!(plan.run.on_leak, OnLeak::Fail);
    }
}

/// A cause of failure worth another attempt (`retry_on`): a failure class (`"hung"`,
/// `"timeout"`, `"exit_code"`, …), `"xid"` (a GPU fault hit the attempt's GPUs), `"lost"`
/// (its Slurm node was lost under it) or `"exit:N"` (exit code N, or death by signal N-128).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryCause {
    /// A failure of this class.
    Class(crate::status::FailureClass),
    /// An XID reported for one of the attempt's GPUs.
    Xid,
    /// The attempt was lost with its Slurm node (a placed stage).
    Lost,
    /// This exit code (a signal's number plus 128 matches death by that signal).
    Exit(i32),
}

impl std::str::FromStr for RetryCause {
    type Err = String;
    fn from_str(s: &str) -> Result<RetryCause, String> {
        match s {
            "xid" => return Ok(RetryCause::Xid),
            "lost" => return Ok(RetryCause::Lost),
            _ => {}
        }
        if let Some(code) = s.strip_prefix("exit:") {
            return code
                .parse()
                .map(RetryCause::Exit)
                .map_err(|_| format!("`{s}`: exit:N takes an exit code, such as exit:137"));
        }
        s.parse().map(RetryCause::Class).map_err(|_| {
            format!("`{s}` is not a cause to retry on: a failure class (hung, timeout, exit_code, signal, rank_failed, cuda_oom, …), xid, lost or exit:N")
        })
    }
}

impl Serialize for RetryCause {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RetryCause::Class(c) => s.serialize_str(c.as_str()),
            RetryCause::Xid => s.serialize_str("xid"),
            RetryCause::Lost => s.serialize_str("lost"),
            RetryCause::Exit(code) => s.serialize_str(&format!("exit:{code}")),
        }
    }
}

impl<'de> Deserialize<'de> for RetryCause {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RetryCause, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for RetryCause {
    fn schema_name() -> String {
        "RetryCause".into()
    }
    fn json_schema(generator: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        String::json_schema(generator)
    }
}
