//! Stand-in GPUs for tests on machines without NVML: `ORCHESTRATE_FAKE_GPUS=N` makes the
//! inventory N GPUs named `GPU-fake-<i>` whose memory is read from files, so scheduling and
//! the "held by someone else" rules can be exercised on a CPU machine by real processes.
//!
//! A foreign holder of GPU `GPU-fake-<i>` is a line `PID NAME BYTES` in the file
//! `$ORCHESTRATE_FAKE_GPU_DIR/GPU-fake-<i>`, or in any file of the directory
//! `$ORCHESTRATE_FAKE_GPU_DIR/GPU-fake-<i>.d/` (one per process, so that stages sharing a GPU
//! need not write one file together); its used memory is the sum of the lines' bytes.
//! Its utilisation (percent) is the number in `GPU-fake-<i>.util` there, if that file exists.
//!
//! Health, for tests of XIDs and the health gate: each line `XID` appended to
//! `$ORCHESTRATE_FAKE_GPU_DIR/GPU-fake-<i>.xid` is an XID the driver reports for that GPU, seen
//! when the probe first reads it; `GPU-fake-<i>.health` holds the error counters as lines
//! `uncorrectable_ecc N`, `pending_remaps N`, `retired_pages N`.
//! Not for production: stages placed on fake GPUs get indices 0..N in `CUDA_VISIBLE_DEVICES`,
//! which on a machine with real GPUs name real ones that nothing verifies.

use super::{GpuInfo, Holder, MemoryProbe, ProbeError};
use std::path::PathBuf;

/// The variable that turns fake GPUs on.
pub const FAKE_GPUS_VAR: &str = "ORCHESTRATE_FAKE_GPUS";
/// The directory of holder files.
pub const FAKE_GPU_DIR_VAR: &str = "ORCHESTRATE_FAKE_GPU_DIR";

/// Fake GPUs and their probe, when [`FAKE_GPUS_VAR`] asks for them.
pub fn from_env() -> Option<(Vec<GpuInfo>, FakeProbe)> {
    let n: u32 = std::env::var(FAKE_GPUS_VAR).ok()?.parse().ok()?;
    let gpus = (0..n)
        .map(|index| GpuInfo {
            index,
            cuda_index: index,
            uuid: format!("GPU-fake-{index}"),
            name: "fake GPU".into(),
            total_bytes: 80 << 30,
        })
        .collect();
    let dir = std::env::var_os(FAKE_GPU_DIR_VAR).map(PathBuf::from);
    Some((
        gpus,
        FakeProbe {
            dir,
            xids: Default::default(),
        },
    ))
}

/// Reads holder files.
pub struct FakeProbe {
    dir: Option<PathBuf>,
    /// Per GPU, the XIDs read so far and when each was first read.
    xids: std::sync::Mutex<std::collections::HashMap<String, Vec<(f64, u64)>>>,
}

impl MemoryProbe for FakeProbe {
    fn used_bytes(&self, uuid: &str) -> Result<u64, ProbeError> {
        Ok(self.holders(uuid).iter().filter_map(|h| h.bytes).sum())
    }

    /// The percentage in the file `<uuid>.util` beside the holder files, if there is one.
    fn utilization(&self, uuid: &str) -> Option<u32> {
        let path = self.dir.as_ref()?.join(format!("{uuid}.util"));
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    }

    fn holders(&self, uuid: &str) -> Vec<Holder> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        let mut text = std::fs::read_to_string(dir.join(uuid)).unwrap_or_default();
        if let Ok(entries) = std::fs::read_dir(dir.join(format!("{uuid}.d"))) {
            let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
            files.sort();
            for file in files {
                text.push('\n');
                text.push_str(&std::fs::read_to_string(file).unwrap_or_default());
            }
        }
        text.lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                let pid = parts.next()?.parse().ok()?;
                let name = parts.next()?.to_string();
                let bytes = parts.next().and_then(|b| b.parse().ok());
                Some(Holder { pid, name, bytes })
            })
            .collect()
    }

    fn xids_since(&self, uuid: &str, since: f64) -> Vec<(f64, u64)> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        let text = std::fs::read_to_string(dir.join(format!("{uuid}.xid"))).unwrap_or_default();
        let listed: Vec<u64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        let mut seen = self.xids.lock().unwrap_or_else(|e| e.into_inner());
        let known = seen.entry(uuid.to_string()).or_default();
        let now = crate::timefmt::unix_secs_f64();
        for &xid in &listed[known.len().min(listed.len())..] {
            known.push((now, xid));
        }
        known
            .iter()
            .filter(|(at, _)| *at >= since)
            .copied()
            .collect()
    }

    fn counters(&self, uuid: &str) -> Option<super::health::Counters> {
        let dir = self.dir.as_ref()?;
        let text = std::fs::read_to_string(dir.join(format!("{uuid}.health"))).ok()?;
        let mut c = super::health::Counters::default();
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            let (Some(name), Some(Ok(n))) = (parts.next(), parts.next().map(str::parse)) else {
                continue;
            };
            match name {
                "uncorrectable_ecc" => c.uncorrectable_ecc = Some(n),
                "pending_remaps" => c.pending_remaps = Some(n),
                "retired_pages" => c.retired_pages = Some(n),
                _ => {}
            }
        }
        Some(c)
    }
}
