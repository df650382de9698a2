//! Exclusive assignment of whole GPUs to stages, and quarantine.

use super::GpuInfo;
use std::collections::BTreeSet;

/// The GPUs of the machine and who holds each. A GPU belongs to at most one stage at a time,
/// so that its memory check measures that stage alone.
#[derive(Debug, Clone)]
pub struct GpuPool {
    gpus: Vec<GpuInfo>,
    busy: BTreeSet<String>,
    quarantined: BTreeSet<String>,
}

impl GpuPool {
    /// A pool of `gpus`, all free.
    pub fn new(gpus: Vec<GpuInfo>) -> GpuPool {
        GpuPool {
            gpus,
            busy: BTreeSet::new(),
            quarantined: BTreeSet::new(),
        }
    }

    /// Every GPU, quarantined or not.
    pub fn all(&self) -> &[GpuInfo] {
        &self.gpus
    }

    /// GPUs that can still be given to stages (not quarantined).
    pub fn usable(&self) -> usize {
        self.gpus.len() - self.quarantined.len()
    }

    /// Takes `n` free GPUs (lowest index first), or `None` if fewer are free now.
    pub fn take(&mut self, n: usize) -> Option<Vec<GpuInfo>> {
        let free: Vec<GpuInfo> = self
            .gpus
            .iter()
            .filter(|g| !self.busy.contains(&g.uuid) && !self.quarantined.contains(&g.uuid))
            .take(n)
            .cloned()
            .collect();
        if free.len() < n {
            return None;
        }
        for g in &free {
            self.busy.insert(g.uuid.clone());
        }
        Some(free)
    }

    /// Gives GPUs back.
    pub fn give_back(&mut self, gpus: &[GpuInfo]) {
        for g in gpus {
            self.busy.remove(&g.uuid);
        }
    }

    /// No further stage will be placed on `uuid`.
    pub fn quarantine(&mut self, uuid: &str) {
        self.quarantined.insert(uuid.to_string());
    }

    /// Whether `uuid` is quarantined.
    pub fn is_quarantined(&self, uuid: &str) -> bool {
        self.quarantined.contains(uuid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(i: u32) -> GpuInfo {
        GpuInfo {
            index: i,
            uuid: format!("GPU-{i}"),
            name: "H200".into(),
            total_bytes: 140 << 30,
        }
    }

    #[test]
    fn exclusive_and_quarantine() {
        let mut pool = GpuPool::new(vec![gpu(0), gpu(1)]);
        let a = pool.take(1).unwrap();
        assert_eq!(a[0].uuid, "GPU-0");
        let b = pool.take(1).unwrap();
        assert_eq!(b[0].uuid, "GPU-1");
        assert!(pool.take(1).is_none(), "both busy");
        pool.give_back(&a);
        pool.quarantine("GPU-0");
        assert!(pool.take(1).is_none(), "GPU-0 is quarantined, GPU-1 busy");
        pool.give_back(&b);
        assert_eq!(pool.take(1).unwrap()[0].uuid, "GPU-1");
        assert_eq!(pool.usable(), 1);
        assert!(pool.take(2).is_none());
    }
}
