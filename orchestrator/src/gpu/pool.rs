//! Assignment of GPUs to stages, whole or in shares of declared memory, and quarantine.

use super::GpuInfo;
use std::collections::{BTreeMap, BTreeSet};

/// The GPUs of the machine and who holds each. A GPU belongs either to one stage (whole),
/// or to stages sharing it whose declared memory fits in it together (`gpu_memory`), never
/// both at once.
#[derive(Debug, Clone)]
pub struct GpuPool {
    gpus: Vec<GpuInfo>,
    /// Busy GPUs, with who holds them ("run X, stage Y").
    busy: BTreeMap<String, String>,
    /// Shared GPUs: each sharing stage with the bytes it declared.
    shares: BTreeMap<String, BTreeMap<String, u64>>,
    quarantined: BTreeSet<String>,
}

impl GpuPool {
    /// A pool of `gpus`, all free.
    pub fn new(gpus: Vec<GpuInfo>) -> GpuPool {
        GpuPool {
            gpus,
            busy: BTreeMap::new(),
            shares: BTreeMap::new(),
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

    /// Who holds `uuid` now, if one of our stages holds it whole.
    pub fn holder(&self, uuid: &str) -> Option<&str> {
        self.busy.get(uuid).map(String::as_str)
    }

    /// The stages sharing `uuid` now, with the bytes each declared (empty when none).
    pub fn sharers(&self, uuid: &str) -> Vec<(&str, u64)> {
        self.shares
            .get(uuid)
            .map(|s| s.iter().map(|(o, b)| (o.as_str(), *b)).collect())
            .unwrap_or_default()
    }

    /// Gives `owner` a share of `bytes` of GPU `uuid` (the caller checked that it fits).
    pub fn take_share(&mut self, uuid: &str, owner: &str, bytes: u64) -> Option<GpuInfo> {
        let gpu = self.gpus.iter().find(|g| g.uuid == uuid)?.clone();
        if self.busy.contains_key(uuid) || self.quarantined.contains(uuid) {
            return None;
        }
        self.shares
            .entry(uuid.to_string())
            .or_default()
            .insert(owner.to_string(), bytes);
        Some(gpu)
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
            let taken = self.busy.contains_key(&g.uuid) || self.shares.contains_key(&g.uuid);
            if !taken && !self.quarantined.contains(&g.uuid) && usable(g) {
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

    /// Gives back what `owner` holds of `gpus` (the whole GPU, or its share).
    pub fn give_back(&mut self, gpus: &[GpuInfo], owner: &str) {
        for g in gpus {
            if self.busy.get(&g.uuid).is_some_and(|o| o == owner) {
                self.busy.remove(&g.uuid);
            }
            if let Some(shares) = self.shares.get_mut(&g.uuid) {
                shares.remove(owner);
                if shares.is_empty() {
                    self.shares.remove(&g.uuid);
                }
            }
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
        pool.give_back(&a, "a");
        pool.quarantine("GPU-0");
        assert!(
            pool.take(1, "c", any).is_none(),
            "GPU-0 is quarantined, GPU-1 busy"
        );
        pool.give_back(&b, "b");
        assert_eq!(pool.take(1, "c", any).unwrap()[0].uuid, "GPU-1");
        assert_eq!(pool.usable(), 1);
        assert!(pool.take(2, "d", any).is_none());
        assert!(pool.lift_quarantine("GPU-0") && !pool.lift_quarantine("GPU-0"));
        assert_eq!(pool.take(1, "e", any).unwrap()[0].uuid, "GPU-0");
    }

    #[test]
    fn shares_keep_a_gpu_from_being_taken_whole_until_the_last_one_is_back() {
        let mut pool = GpuPool::new(vec![gpu(0)]);
        let any = |_: &GpuInfo| true;
        let g = pool.take_share("GPU-0", "a", 20 << 30).unwrap();
        pool.take_share("GPU-0", "b", 20 << 30).unwrap();
        assert_eq!(
            pool.sharers("GPU-0"),
            vec![("a", 20 << 30), ("b", 20 << 30)]
        );
        assert!(pool.take(1, "whole", any).is_none(), "shared");
        pool.give_back(std::slice::from_ref(&g), "a");
        assert!(pool.take(1, "whole", any).is_none(), "b still shares it");
        pool.give_back(std::slice::from_ref(&g), "b");
        let whole = pool.take(1, "whole", any).unwrap();
        assert!(pool.take_share("GPU-0", "c", 1).is_none(), "held whole");
        pool.give_back(&whole, "someone else");
        assert_eq!(
            pool.holder("GPU-0"),
            Some("whole"),
            "only its holder gives it back"
        );
    }

    #[test]
    fn a_gpu_that_is_not_usable_is_skipped() {
        let mut pool = GpuPool::new(vec![gpu(0), gpu(1)]);
        let got = pool.take(1, "a", |g| g.uuid != "GPU-0").unwrap();
        assert_eq!(got[0].uuid, "GPU-1");
        assert!(pool.take(1, "b", |g| g.uuid != "GPU-0").is_none());
    }
}
