//! GPU truth: which GPUs the machine has (by UUID), who may use them, and whether a stage gave
//! its memory back.
//!
//! NVML is loaded at run time ([`discover`]); a machine without it still runs plans and the
//! report says the check was unavailable. Everything that decides (baseline, tolerance,
//! timeout, verdict, quarantine) works on the [`MemoryProbe`] trait, so it is tested against
//! recorded samples; [`NvmlProbe`] is the only production probe.

pub(crate) mod attribution;
pub mod check;
pub(crate) mod fake;
pub mod health;
pub mod mps;
mod nvml;
mod nvml_health;
mod pool;
mod reclaim;
pub(crate) mod release;
pub(crate) mod shared;
pub(crate) mod svg;
pub(crate) mod timeline;
pub(crate) mod visible;

pub use nvml::{
    discover, listen_for_xids, Inventory, NvmlProbe, NvmlUnavailable, NO_DRIVER, NO_DRIVER_NOTE,
};
pub use pool::GpuPool;
pub use reclaim::{await_reclaim, ReclaimVerdict};

/// One GPU of the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// NVML index (NVML numbers GPUs in PCI bus order).
    pub index: u32,
    /// The index CUDA gives this GPU under `CUDA_DEVICE_ORDER=PCI_BUS_ID`: its place among
    /// every GPU of the machine sorted by PCI bus id (equal to `index` where NVML keeps its
    /// documented order; `visible` hands stages this one).
    pub cuda_index: u32,
    /// NVML UUID ("GPU-…").
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Installed memory in bytes.
    pub total_bytes: u64,
}

/// A process holding GPU memory, as the driver reports it (in containers the PID may be the
/// host's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// PID as NVML reports it.
    pub pid: u32,
    /// Command name when the PID is visible here, else "?".
    pub name: String,
    /// Bytes it holds, when the driver says.
    pub bytes: Option<u64>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} ({})", self.pid, self.name)?;
        if let Some(bytes) = self.bytes {
            write!(f, " holding {} MiB", bytes / (1 << 20))?;
        }
        Ok(())
    }
}

/// Why a GPU's memory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The probe does not know a GPU of that UUID.
    #[error("unknown GPU {uuid}")]
    UnknownGpu {
        /// The UUID asked for.
        uuid: String,
    },
    /// NVML refused (the GPU fell off the bus, the driver went away, …).
    #[error(transparent)]
    Nvml(#[from] nvml_wrapper::error::NvmlError),
}

/// Reads device memory. Implemented by NVML in production and by recorded samples in tests.
pub trait MemoryProbe {
    /// Bytes in use on the GPU now (the device-level figure, all processes).
    fn used_bytes(&self, uuid: &str) -> Result<u64, ProbeError>;
    /// Processes holding memory on the GPU now.
    fn holders(&self, uuid: &str) -> Vec<Holder>;
    /// The GPU's utilisation over the driver's last sample period, in percent, when the probe
    /// can read it (for the web view's machine panel; no verdict depends on it).
    fn utilization(&self, _uuid: &str) -> Option<u32> {
        None
    }
    /// The XIDs the driver reported for the GPU at or after `since` (Unix seconds), each with
    /// when it was seen. Empty where XIDs cannot be read.
    fn xids_since(&self, uuid: &str, since: f64) -> Vec<(f64, u64)> {
        let _ = (uuid, since);
        Vec::new()
    }
    /// The GPU's error counters, for the health gate ([`health::refusal`]); `None` where they
    /// cannot be read.
    fn counters(&self, uuid: &str) -> Option<health::Counters> {
        let _ = uuid;
        None
    }
}

/// How many GPUs this machine offers stages: the fake ones where they are asked for
/// (`ORCHESTRATE_FAKE_GPUS`), else NVML's count (0 without the driver).
pub fn machine_gpu_count() -> usize {
    if let Some((gpus, _)) = fake::from_env() {
        return gpus.len();
    }
    match discover() {
        Inventory::Available { gpus, .. } => gpus.len(),
        Inventory::Unavailable(_) => 0,
    }
}
