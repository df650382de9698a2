//! Exclusive assignment of whole GPUs to stages, and quarantine.

use super::GpuInfo;
use std::collections::{BTreeMap, BTreeSet};

/// The GPUs of the machine and who holds each. A GPU belongs to at most one stage at a time,
/// so that its memory check measures that stage alone.
#[derive(Debug, Clone)]
pub struct GpuPool {
    gpus: Vec<GpuInfo>,
    /// Busy GPUs, with who holds them ("run X, stage Y").
    busy: BTreeMap<String, String>,
    quarantined: BTreeSet<String>,
}

impl GpuPool {
    /// A pool of `gpus`, all free.
    pub fn new(gpus: Vec<GpuInfo>) -> GpuPool {
        GpuPool {
            gpus,
            busy: BTreeMap::new(),
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

    /// Who holds `uuid` now, if one of our stages does.
    pub fn holder(&self, uuid: &str) -> Option<&str> {
        self.busy.get(uuid).map(String::as_str)
    }

    /// Whether `uuid` is quarantined.
    pub fn quarantined(&self, uuid: &str) -> bool {
        self.quarantined.contains(uuid)
    }

    /// Takes `n` free, unquarantined GPUs for which `usable` says yes (lowest index first), or
    /// `None` if fewer are available now.
    pub fn take(
        &mut self,
        n: usize,
        owner: &str,
        mut usable: impl FnMut(&GpuInfo) -> bool,
    ) -> Option<Vec<GpuInfo>> {
        let mut free = Vec::with_capacity(n);
        for g in &self.gpus {
            if free.len() == n {
                break;
            }
            if !self.busy.contains_key(&g.uuid) && !self.quarantined.contains(&g.uuid) && usable(g)
            {
                free.push(g.clone());
            }
        }
        if free.len() < n {
            return None;
        }
        for g in &free {
            self.busy.insert(g.uuid.clone(), owner.to_string());
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

    /// Stages may be placed on `uuid` again; whether it was quarantined.
    pub fn lift_quarantine(&mut self, uuid: &str) -> bool {
        self.quarantined.remove(uuid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(i: u32) -> GpuInfo {
        GpuInfo {
            cuda_index: i,
            index: i,
            uuid: format!("GPU-{i}"),
            name: "H200".into(),
            total_bytes: 140 << 30,
        }
    }

    #[test]
    fn exclusive_and_quarantine() {
        let mut pool = GpuPool::new(vec![gpu(0), gpu(1)]);
        let any = |_: &GpuInfo| true;
        let a = pool.take(1, "a", any).unwrap();
        assert_eq!(a[0].uuid, "GPU-0");
        assert_eq!(pool.holder("GPU-0"), Some("a"));
        let b = pool.take(1, "b", any).unwrap();
        assert_eq!(b[0].uuid, "GPU-1");
        assert!(pool.take(1, "c", any).is_none(), "both busy");
        pool.give_back(&a);
        pool.quarantine("GPU-0");
        assert!(
            pool.take(1, "c", any).is_none(),
            "GPU-0 is quarantined, GPU-1 busy"
        );
        pool.give_back(&b);
        assert_eq!(pool.take(1, "c", any).unwrap()[0].uuid, "GPU-1");
        assert_eq!(pool.usable(), 1);
        assert!(pool.take(2, "d", any).is_none());
        assert!(pool.lift_quarantine("GPU-0") && !pool.lift_quarantine("GPU-0"));
        assert_eq!(pool.take(1, "e", any).unwrap()[0].uuid, "GPU-0");
    }

    #[test]
    fn a_gpu_that_is_not_usable_is_skipped() {
        let mut pool = GpuPool::new(vec![gpu(0), gpu(1)]);
        let got = pool.take(1, "a", |g| g.uuid != "GPU-0").unwrap();
        assert_eq!(got[0].uuid, "GPU-1");
        assert!(pool.take(1, "b", |g| g.uuid != "GPU-0").is_none());
    }
}
