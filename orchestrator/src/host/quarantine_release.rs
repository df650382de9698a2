//! `orchestrate gpu release`: a quarantined GPU given back to stages once the driver shows it
//! empty.
//!
//! Promise of [`Host::release_quarantined_gpu`]: the quarantine is lifted only when the GPU
//! is quarantined, the driver lists no process on it and its used memory is within the
//! tolerance of its idle baseline; otherwise nothing changes and the refusal names what holds
//! it (pid and process name, or the unlisted memory).

use super::Host;
use crate::gpu::GpuInfo;

/// How far above its idle baseline a GPU may be and still count as empty for a release: the
/// plans' default `gpu_tolerance_mib`.
pub const RELEASE_TOLERANCE: u64 = 64 << 20;

/// Why a GPU was not given back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseRefused {
    /// No GPU of this host has that index or UUID.
    #[error("no GPU {0:?} on this host (give its NVML index or UUID)")]
    Unknown(String),
    /// It is not quarantined: stages may use it already.
    #[error("GPU {index} ({uuid}) is not quarantined: stages may use it already")]
    NotQuarantined {
        /// NVML index.
        index: u32,
        /// UUID.
        uuid: String,
    },
    /// Something still holds memory on it.
    #[error("GPU {index} ({uuid}) is still held: {why}; it stays quarantined (end that process, then release it again)")]
    Held {
        /// NVML index.
        index: u32,
        /// UUID.
        uuid: String,
        /// The holders ("pid 42 (python) holding 1024 MiB"), or the memory nobody listed.
        why: String,
    },
}

impl Host {
    /// The GPU named `name` (its NVML index, or its UUID or a unique prefix of it).
    pub fn gpu_named(&self, name: &str) -> Option<&GpuInfo> {
        let gpus = self.gpus();
        if let Ok(index) = name.parse::<u32>() {
            return gpus.iter().find(|g| g.index == index);
        }
        let mut found = gpus.iter().filter(|g| g.uuid.starts_with(name));
        match (found.next(), found.next()) {
            (Some(g), None) => Some(g),
            _ => None,
        }
    }

    /// Gives quarantined GPU `name` back to stages, if the driver shows it empty (see the
    /// module's promise); the GPU released.
    pub fn release_quarantined_gpu(&self, name: &str) -> Result<GpuInfo, ReleaseRefused> {
        let gpu = self
            .gpu_named(name)
            .cloned()
            .ok_or_else(|| ReleaseRefused::Unknown(name.to_string()))?;
        if !self.quarantined(&gpu.uuid) {
            return Err(ReleaseRefused::NotQuarantined {
                index: gpu.index,
                uuid: gpu.uuid,
            });
        }
        if let Some(probe) = &self.inventory.probe {
            let held = |why: String| ReleaseRefused::Held {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                why,
            };
            let holders = probe.holders(&gpu.uuid);
            if !holders.is_empty() {
                let names: Vec<String> = holders.iter().map(ToString::to_string).collect();
                return Err(held(names.join(", ")));
            }
            let used = probe
                .used_bytes(&gpu.uuid)
                .map_err(|e| held(format!("its memory cannot be read ({e})")))?;
            let idle = self.idle_baseline(&gpu.uuid).unwrap_or(0);
            if used > idle.saturating_add(RELEASE_TOLERANCE) {
                return Err(held(format!(
                    "{} MiB in use by something the driver does not list (idle: {} MiB)",
                    used >> 20,
                    idle >> 20
                )));
            }
        }
        self.lift_quarantine(&gpu.uuid);
        Ok(gpu)
    }
}
