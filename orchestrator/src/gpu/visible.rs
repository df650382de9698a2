//! How a stage is told which GPUs are its own, in the form every framework reads.
//!
//! Frameworks parse `CUDA_VISIBLE_DEVICES` as integers (DeepSpeed 0.19.8's CUDA accelerator
//! fails at `deepspeed.initialize` on a UUID, measured on an H200), so a stage gets CUDA
//! indices there, with `CUDA_DEVICE_ORDER=PCI_BUS_ID` so that CUDA numbers the GPUs in PCI bus
//! order, as NVML does. The index of each GPU is computed from its PCI bus id at start-up
//! ([`assign_cuda_indices`]), so the GPU a stage's CUDA context lands on is exactly the one
//! whose memory is verified, even on a machine where NVML's numbering were to differ. The
//! UUIDs travel in [`ENV_GPU_UUIDS`]; a plan can keep UUIDs in `CUDA_VISIBLE_DEVICES`
//! (`run.cuda_visible_devices = "uuid"`), which MIG instances need.

use super::GpuInfo;
use protocol::plan::VisibleDevices;

/// The variable holding the UUIDs of the stage's GPUs, comma-separated, in the order of
/// `CUDA_VISIBLE_DEVICES`.
pub const ENV_GPU_UUIDS: &str = "ORCHESTRATE_GPU_UUIDS";

/// Whether NVML's own numbering agrees with PCI bus order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexOrder {
    /// Every GPU's NVML index is its place in PCI bus order (the documented case).
    Agrees,
    /// They differ for at least one GPU; stages get the PCI bus order (what CUDA uses under
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID`). The text names the first GPU that differs.
    Differs(String),
    /// A GPU's bus id could not be read: NVML's index is used as is.
    Unknown,
}

impl IndexOrder {
    /// A line for the run's console when the order is not the documented one.
    pub fn note(&self) -> Option<String> {
        match self {
            IndexOrder::Agrees => None,
            IndexOrder::Differs(what) => Some(format!(
                "NVML numbers the GPUs differently from their PCI bus order ({what}): stages get CUDA indices in PCI bus order"
            )),
            IndexOrder::Unknown => Some(
                "a GPU's PCI bus id could not be read: stages get NVML's indices in CUDA_VISIBLE_DEVICES".into(),
            ),
        }
    }
}

/// Sets each GPU's `cuda_index` to its place among `gpus` sorted by PCI bus id (`bus_ids[i]`
/// belongs to `gpus[i]`; `gpus` is every GPU NVML lists), and says whether that matches
/// NVML's numbering. Without every bus id, `cuda_index` stays NVML's index.
pub fn assign_cuda_indices(gpus: &mut [GpuInfo], bus_ids: &[Option<String>]) -> IndexOrder {
    let Some(ids) = bus_ids
        .iter()
        .map(|b| b.as_deref().map(normalise_bus_id))
        .collect::<Option<Vec<_>>>()
    else {
        return IndexOrder::Unknown;
    };
    let mut by_bus: Vec<usize> = (0..gpus.len()).collect();
    by_bus.sort_by(|&a, &b| ids[a].cmp(&ids[b]));
    let mut first_difference = None;
    for (rank, &i) in by_bus.iter().enumerate() {
        let g = &mut gpus[i];
        g.cuda_index = rank as u32;
        if g.cuda_index != g.index && first_difference.is_none() {
            first_difference = Some(format!(
                "NVML GPU {} at bus {} is CUDA GPU {}",
                g.index, ids[i], g.cuda_index
            ));
        }
    }
    match first_difference {
        None => IndexOrder::Agrees,
        Some(what) => IndexOrder::Differs(what),
    }
}

/// NVML writes bus ids as `00000000:1B:00.0` (a domain of 8 hex digits), CUDA and sysfs as
/// `0000:1b:00.0`: one form, so that they sort alike.
fn normalise_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) => {
            let domain = domain.trim_start_matches('0');
            format!("{domain:0>8}:{rest}")
        }
        None => id,
    }
}

/// The variables that give a stage `gpus` (in this order): `CUDA_VISIBLE_DEVICES`
/// (CUDA indices, or UUIDs when the plan asks), `CUDA_DEVICE_ORDER=PCI_BUS_ID` and
/// [`ENV_GPU_UUIDS`]. An empty list hides every GPU (`CUDA_VISIBLE_DEVICES=""`).
pub fn stage_env(gpus: &[GpuInfo], form: VisibleDevices) -> Vec<(String, String)> {
    let join = |f: &dyn Fn(&GpuInfo) -> String| gpus.iter().map(f).collect::<Vec<_>>().join(",");
    let visible = match form {
        VisibleDevices::Index => join(&|g| g.cuda_index.to_string()),
        VisibleDevices::Uuid => join(&|g| g.uuid.clone()),
    };
    vec![
        ("CUDA_VISIBLE_DEVICES".into(), visible),
        ("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()),
        (ENV_GPU_UUIDS.into(), join(&|g| g.uuid.clone())),
    ]
}

/// The CUDA driver's number of hardware work queues per context (8 by default).
pub const ENV_MAX_CONNECTIONS: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// The variables of a stage that shares `gpu` (`gpu_memory = bytes`): `ORCHESTRATE_GPU_MEMORY`
/// (the bytes it declared) and `ORCHESTRATE_GPU_MEMORY_FRACTION` (of the GPU's memory), which
/// the Python helper's `cap_gpu_memory()` hands to PyTorch's caching allocator; and
/// `CUDA_DEVICE_MAX_CONNECTIONS=1` unless `set_elsewhere` says the stage's plan or the
/// orchestrator's own environment gives it a value.
///
/// One work queue per context: the driver makes a context with fewer queues faster, and makes
/// contexts one at a time per GPU, so stages that start side by side on one GPU wait less for
/// each other (`bench/sharing` has the figures). The price, the streams of one stage sharing
/// one queue, is small for the small stages that share a GPU.
pub fn share_env(
    bytes: u64,
    gpu: &GpuInfo,
    set_elsewhere: &dyn Fn(&str) -> bool,
) -> Vec<(String, String)> {
    let fraction = (bytes as f64 / gpu.total_bytes.max(1) as f64).min(1.0);
    let mut env = vec![
        ("ORCHESTRATE_GPU_MEMORY".into(), bytes.to_string()),
        (
            "ORCHESTRATE_GPU_MEMORY_FRACTION".into(),
            format!("{fraction:.6}"),
        ),
    ];
    if !set_elsewhere(ENV_MAX_CONNECTIONS) {
        env.push((ENV_MAX_CONNECTIONS.into(), "1".into()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> GpuInfo {
        GpuInfo {
            index,
            cuda_index: index,
            uuid: format!("GPU-{index}"),
            name: "H200".into(),
            total_bytes: 1,
        }
    }

    fn value<'a>(env: &'a [(String, String)], key: &str) -> &'a str {
        &env.iter().find(|(k, _)| k == key).unwrap().1
    }

    #[test]
    fn indices_by_default_uuids_beside_them() {
        let env = stage_env(&[gpu(3), gpu(1)], VisibleDevices::Index);
        assert_eq!(value(&env, "CUDA_VISIBLE_DEVICES"), "3,1");
        assert_eq!(value(&env, "CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
        assert_eq!(value(&env, ENV_GPU_UUIDS), "GPU-3,GPU-1");
        let env = stage_env(&[gpu(3)], VisibleDevices::Uuid);
        assert_eq!(value(&env, "CUDA_VISIBLE_DEVICES"), "GPU-3");
        let env = stage_env(&[], VisibleDevices::Index);
        assert_eq!(value(&env, "CUDA_VISIBLE_DEVICES"), "");
    }

    #[test]
    fn a_sharing_stage_gets_one_work_queue_unless_its_value_is_set_elsewhere() {
        let mut g = gpu(0);
        g.total_bytes = 80 << 30;
        let env = share_env(8 << 30, &g, &|_| false);
        assert_eq!(
            value(&env, "ORCHESTRATE_GPU_MEMORY"),
            (8u64 << 30).to_string()
        );
        assert_eq!(value(&env, "ORCHESTRATE_GPU_MEMORY_FRACTION"), "0.100000");
        assert_eq!(value(&env, ENV_MAX_CONNECTIONS), "1");
        let env = share_env(8 << 30, &g, &|name| name == ENV_MAX_CONNECTIONS);
        assert!(env.iter().all(|(k, _)| k != ENV_MAX_CONNECTIONS), "{env:?}");
    }

    #[test]
    fn cuda_index_is_the_place_in_pci_bus_order() {
        let mut gpus = vec![gpu(0), gpu(1), gpu(2)];
        let ids = ["00000000:1B:00.0", "00000000:0A:00.0", "00000001:00:00.0"]
            .map(|s| Some(s.to_string()));
        let order = assign_cuda_indices(&mut gpus, &ids);
        assert_eq!(
            gpus.iter().map(|g| g.cuda_index).collect::<Vec<_>>(),
            [1, 0, 2]
        );
        assert!(
            matches!(order, IndexOrder::Differs(ref w) if w.contains("NVML GPU 1") && w.contains("CUDA GPU 0"))
        );
        assert!(order.note().unwrap().contains("PCI bus order"));
    }

    #[test]
    fn documented_order_agrees_and_missing_bus_ids_keep_nvml_indices() {
        let mut gpus = vec![gpu(0), gpu(1)];
        let ids = ["0000:0a:00.0", "00000000:1B:00.0"].map(|s| Some(s.to_string()));
        assert_eq!(assign_cuda_indices(&mut gpus, &ids), IndexOrder::Agrees);
        assert_eq!(IndexOrder::Agrees.note(), None);
        let mut gpus = vec![gpu(0), gpu(1)];
        let order = assign_cuda_indices(&mut gpus, &[Some("0000:1b:00.0".into()), None]);
        assert_eq!(order, IndexOrder::Unknown);
        assert_eq!(gpus[0].cuda_index, 0);
    }
}
