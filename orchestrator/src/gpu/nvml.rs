//! The NVML-backed inventory and probe.

use super::{GpuInfo, Holder, MemoryProbe, ProbeError};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::collections::HashMap;

/// What the machine offers.
pub enum Inventory {
    /// NVML answered; `gpus` may be empty.
    Available {
        /// Every GPU NVML lists.
        gpus: Vec<GpuInfo>,
        /// The probe to read them with.
        probe: Box<NvmlProbe>,
        /// Driver version, for reports.
        driver: String,
        /// Whether NVML's numbering agrees with the PCI bus order stages are told to use.
        order: super::visible::IndexOrder,
    },
    /// NVML could not be loaded or initialised; the reason, for the user.
    Unavailable(NvmlUnavailable),
}

/// Why NVML cannot be used on this machine.
#[derive(Debug, thiserror::Error)]
pub enum NvmlUnavailable {
    /// The library is not on this host: no NVIDIA driver is installed. Said in a few words
    /// rather than the loader's message, on every run of such a host.
    #[error("{}", NO_DRIVER)]
    NoDriver,
    /// The library was loaded but could not be initialised.
    #[error("NVML is not available ({0})")]
    Init(#[source] NvmlError),
    /// It was loaded but could not say how many GPUs there are.
    #[error("NVML could not count GPUs ({0})")]
    Count(#[source] NvmlError),
}

/// What NVML's absence means for a run, in the words runs and `orchestrate doctor` use.
pub const NO_DRIVER: &str = "no NVIDIA driver found";
/// What a run on a host without the driver says once, at its start.
pub const NO_DRIVER_NOTE: &str =
    "no NVIDIA driver found: stages run on the CPU and GPU checks are off";

/// Reads memory through NVML.
pub struct NvmlProbe {
    nvml: Nvml,
    index_by_uuid: HashMap<String, u32>,
    /// The XIDs the process's listener has seen.
    xids: super::nvml_health::XidLog,
}

/// Starts listening for the driver's XIDs (see [`NvmlProbe::xids_since`]), once per process:
/// a run's host does so after its first reads of the GPUs, which the listener's start would
/// otherwise hold up. Commands that only list or check the GPUs never start it.
pub fn listen_for_xids() {
    super::nvml_health::start_listener();
}

/// Loads NVML and lists the GPUs. Never fails: absence is an [`Inventory::Unavailable`].
pub fn discover() -> Inventory {
    let nvml = match Nvml::init() {
        Ok(nvml) => nvml,
        Err(NvmlError::LibloadingError(_)) => {
            return Inventory::Unavailable(NvmlUnavailable::NoDriver)
        }
        Err(e) => return Inventory::Unavailable(NvmlUnavailable::Init(e)),
    };
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => return Inventory::Unavailable(NvmlUnavailable::Count(e)),
    };
    let mut gpus = Vec::new();
    let mut bus_ids = Vec::new();
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let (Ok(uuid), Ok(memory)) = (device.uuid(), device.memory_info()) else {
            continue;
        };
        bus_ids.push(device.pci_info().map(|p| p.bus_id).ok());
        gpus.push(GpuInfo {
            index,
            cuda_index: index,
            uuid,
            name: device.name().unwrap_or_else(|_| "unknown GPU".into()),
            total_bytes: memory.total,
        });
    }
    let order = super::visible::assign_cuda_indices(&mut gpus, &bus_ids);
    let driver = nvml
        .sys_driver_version()
        .unwrap_or_else(|_| "unknown".into());
    let index_by_uuid = gpus.iter().map(|g| (g.uuid.clone(), g.index)).collect();
    Inventory::Available {
        gpus,
        probe: Box::new(NvmlProbe {
            nvml,
            index_by_uuid,
            xids: super::nvml_health::xid_log(),
        }),
        driver,
        order,
    }
}

impl MemoryProbe for NvmlProbe {
    fn used_bytes(&self, uuid: &str) -> Result<u64, ProbeError> {
        let index = self
            .index_by_uuid
            .get(uuid)
            .ok_or_else(|| ProbeError::UnknownGpu {
                uuid: uuid.to_string(),
            })?;
        let device = self.nvml.device_by_index(*index)?;
        Ok(device.memory_info()?.used)
    }

    fn utilization(&self, uuid: &str) -> Option<u32> {
        let index = self.index_by_uuid.get(uuid)?;
        let device = self.nvml.device_by_index(*index).ok()?;
        device.utilization_rates().ok().map(|u| u.gpu)
    }

    fn holders(&self, uuid: &str) -> Vec<Holder> {
        let Some(index) = self.index_by_uuid.get(uuid) else {
            return Vec::new();
        };
        let Ok(device) = self.nvml.device_by_index(*index) else {
            return Vec::new();
        };
        device
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .map(|p| Holder {
                pid: p.pid,
                name: crate::process::scan::comm(p.pid as i32),
                bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect()
    }

    fn xids_since(&self, uuid: &str, since: f64) -> Vec<(f64, u64)> {
        super::nvml_health::since(&self.xids, uuid, since)
    }

    fn counters(&self, uuid: &str) -> Option<super::health::Counters> {
        let index = self.index_by_uuid.get(uuid)?;
        let device = self.nvml.device_by_index(*index).ok()?;
        Some(super::nvml_health::counters(&device))
    }
}
