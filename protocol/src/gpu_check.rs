//! What `orchestrate gpu-check --json` prints: every GPU of the node and whether it is clean
//! (no compute process, memory at or under the threshold). Slurm prolog/epilog scripts and the
//! per-node check of a multi-node stage read it.

use serde::{Deserialize, Serialize};

/// What one GPU looks like now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuState {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Installed bytes.
    pub total_bytes: u64,
    /// Used bytes.
    pub used_bytes: u64,
    /// Compute processes holding memory ("pid N (name) holding M MiB").
    pub processes: Vec<String>,
    /// No compute process and used memory at or under the threshold.
    pub clean: bool,
}

/// The command's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    /// Protocol version.
    pub v: u32,
    /// Host name.
    pub host: String,
    /// NVML driver version.
    pub driver: String,
    /// Threshold used, bytes.
    pub max_used_bytes: u64,
    /// Every GPU.
    pub gpus: Vec<GpuState>,
    /// Every GPU clean.
    pub clean: bool,
    /// How long the command waited for the GPUs to become clean.
    pub waited_ms: f64,
    /// Set when NVML's numbering of the GPUs differs from their PCI bus order (which stages
    /// are given), or a bus id could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_note: Option<String>,
}
