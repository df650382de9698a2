//! The verdict of a stage that shared its GPU with other stages (`gpu_memory`).
//!
//! The device's figure mixes every sharer's memory, so a sharing stage is judged by what the
//! driver lists: its baseline is the memory no listed process accounts for when it started
//! (the idle context and reserve), and once its tree is gone the GPU is clean for it when
//! - no process of the stage is listed any more (nor was one besides the main process listed
//!   as the main process exited: a process it left behind holding memory is its leak even
//!   once stopped), and
//! - the memory no listed process accounts for is back at that baseline, within the
//!   tolerance: what the stages still running there hold (their listed processes) is theirs.
//!
//! So the stage that leaves memory behind is the one named `leaked`, and its neighbours stay
//! clean. Sizes per process come from the driver; one that does not give them cannot be
//! judged this way, and the strict verdict stands.

use super::{Holder, MemoryProbe};
use protocol::report::{GpuRecord, GpuVerdict};
use std::time::{Duration, Instant};

/// The memory of GPU `uuid` that no listed process accounts for, and whether every holder's
/// size is known.
pub fn unlisted_bytes(probe: &dyn MemoryProbe, uuid: &str) -> Option<(u64, Vec<Holder>)> {
    let used = probe.used_bytes(uuid).ok()?;
    let holders = probe.holders(uuid);
    let listed: u64 = holders.iter().map(|h| h.bytes.unwrap_or(0)).sum();
    Some((used.saturating_sub(listed), holders))
}

/// A sharing stage's baseline: the memory of GPU `uuid` that no listed process accounts for,
/// read so that it is never too low. The device's figure and the list are two reads, and a
/// neighbour that starts, grows, shrinks or ends between them would make one difference too
/// low by its size; the stage, judged against that baseline once the GPU is quiet, would then
/// be called `leaked` for memory that was never its own. So the list is read before and after
/// the device's figure, and a process counts with the least it held in the two (nothing when
/// it is missing from either): what changed meanwhile stays in the baseline.
pub fn baseline_unlisted(probe: &dyn MemoryProbe, uuid: &str) -> Option<u64> {
    let before = probe.holders(uuid);
    let used = probe.used_bytes(uuid).ok()?;
    let after = probe.holders(uuid);
    let listed: u64 = after
        .iter()
        .filter_map(|h| {
            let earlier = before.iter().find(|b| b.pid == h.pid)?;
            Some(h.bytes.unwrap_or(0).min(earlier.bytes.unwrap_or(0)))
        })
        .sum();
    Some(used.saturating_sub(listed))
}

/// What one sharing stage's GPU looked like while it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareWatch {
    /// The GPU.
    pub uuid: String,
    /// Memory no listed process accounted for as the stage started.
    pub baseline: u64,
    /// The bytes it declared.
    pub declared: u64,
    /// The most its own listed processes held together.
    pub peak: u64,
    /// Its processes that the driver listed at some point.
    pub pids: Vec<u32>,
    /// Listed processes found not to be its own (each is looked up once: a lookup may scan
    /// `/proc`).
    pub others: Vec<u32>,
    /// A process of it still listed as its main process exited (it left memory behind).
    pub left_behind: Option<Holder>,
}

impl ShareWatch {
    /// Takes a sample: the bytes the stage's processes (`is_stage`) hold now.
    pub fn sample(&mut self, probe: &dyn MemoryProbe, is_stage: &dyn Fn(u32) -> bool) {
        let mut bytes = 0u64;
        for h in probe.holders(&self.uuid) {
            if self.others.contains(&h.pid) {
                continue;
            }
            if !self.pids.contains(&h.pid) {
                if !is_stage(h.pid) {
                    self.others.push(h.pid);
                    continue;
                }
                self.pids.push(h.pid);
            }
            bytes = bytes.saturating_add(h.bytes.unwrap_or(0));
        }
        self.peak = self.peak.max(bytes);
    }

    /// At the main process's exit (`main`, reaped): notes another process of the stage still
    /// holding memory. The main process itself may still be listed for a moment, while the
    /// driver tears its context down; that is not memory left behind, and the verdict waits
    /// for it to leave the list as for any process of the stage.
    pub fn main_exited(
        &mut self,
        probe: &dyn MemoryProbe,
        main: u32,
        is_stage: &dyn Fn(u32) -> bool,
    ) {
        self.sample(probe, is_stage);
        self.left_behind = probe
            .holders(&self.uuid)
            .into_iter()
            .find(|h| h.pid != main && is_stage(h.pid) && h.bytes != Some(0));
    }
}

/// Waits (up to `timeout`) for the GPU to be clean for the stage by the module's rule, and its
/// record. The stage's tree is gone by now.
pub async fn await_shared(
    probe: &dyn MemoryProbe,
    watch: &ShareWatch,
    tolerance: u64,
    timeout: Duration,
) -> GpuRecord {
    let start = Instant::now();
    let mut last: Option<(u64, Vec<Holder>)> = None;
    crate::process::backoff::poll(timeout, Duration::from_millis(20), || {
        last = unlisted_bytes(probe, &watch.uuid);
        match &last {
            Some((unlisted, holders)) => {
                watch.left_behind.is_none()
                    && !holders.iter().any(|h| watch.pids.contains(&h.pid))
                    && *unlisted <= watch.baseline.saturating_add(tolerance)
            }
            None => false,
        }
    })
    .await;
    let reclaim_ms = start.elapsed().as_secs_f64() * 1e3;
    let (unlisted, holders) = last.unwrap_or((u64::MAX, Vec::new()));
    let still: Vec<&Holder> = holders
        .iter()
        .filter(|h| watch.pids.contains(&h.pid))
        .collect();
    let mut notes = Vec::new();
    if let Some(h) = &watch.left_behind {
        notes.push(format!(
            "{h}, a process of the stage, still held memory on the shared GPU when the stage's main process exited (it was stopped)"
        ));
    }
    if !still.is_empty() {
        let names: Vec<String> = still.iter().map(|h| h.to_string()).collect();
        notes.push(format!(
            "still listed on the shared GPU: {}",
            names.join(", ")
        ));
    }
    if unlisted > watch.baseline.saturating_add(tolerance) {
        notes.push(if unlisted == u64::MAX {
            "the GPU's memory cannot be read".to_string()
        } else {
            format!(
                "{} MiB above the stage's baseline are held by no listed process",
                (unlisted - watch.baseline) >> 20
            )
        });
    }
    if watch.peak > watch.declared {
        notes.push(format!(
            "used {} MiB, more than the {} MiB it declared (gpu_memory)",
            watch.peak >> 20,
            watch.declared >> 20
        ));
    }
    let leaked = watch.left_behind.is_some()
        || !still.is_empty()
        || unlisted > watch.baseline.saturating_add(tolerance);
    GpuRecord {
        uuid: watch.uuid.clone(),
        baseline_bytes: watch.baseline,
        peak_bytes: watch.peak,
        after_bytes: if unlisted == u64::MAX {
            watch.baseline
        } else {
            unlisted
        },
        reclaim_ms,
        verdict: match leaked {
            true => GpuVerdict::Leaked,
            false => GpuVerdict::Clean,
        },
        holders: match leaked {
            true => holders.iter().map(ToString::to_string).collect(),
            false => Vec::new(),
        },
        note: (!notes.is_empty()).then(|| notes.join("; ")),
        at_release: false,
        xids: Vec::new(),
        unhealthy: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::ProbeError;
    use super::*;
    use std::cell::RefCell;

    struct Listed {
        used: u64,
        holders: RefCell<Vec<Holder>>,
    }

    impl MemoryProbe for Listed {
        fn used_bytes(&self, _: &str) -> Result<u64, ProbeError> {
            Ok(self.used)
        }
        fn holders(&self, _: &str) -> Vec<Holder> {
            self.holders.borrow().clone()
        }
    }

    const MIB: u64 = 1 << 20;

    fn holder(pid: u32, mib: u64) -> Holder {
        Holder {
            pid,
            name: "python".into(),
            bytes: Some(mib * MIB),
        }
    }

    fn watch(pids: Vec<u32>) -> ShareWatch {
        ShareWatch {
            uuid: "GPU-0".into(),
            baseline: 600 * MIB,
            declared: 4096 * MIB,
            peak: 0,
            pids,
            others: Vec::new(),
            left_behind: None,
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn what_neighbours_still_hold_is_theirs_and_the_stage_is_clean() {
        // Two neighbours hold 2 GiB each; the idle 600 MiB is listed by nobody.
        let probe = Listed {
            used: (600 + 4096) * MIB,
            holders: RefCell::new(vec![holder(7, 2048), holder(8, 2048)]),
        };
        let r = block_on(await_shared(
            &probe,
            &watch(vec![42]),
            64 * MIB,
            Duration::ZERO,
        ));
        assert_eq!(r.verdict, GpuVerdict::Clean, "{r:?}");
    }

    #[test]
    fn a_process_of_the_stage_left_behind_or_still_listed_makes_it_the_leaker() {
        let probe = Listed {
            used: (600 + 2048) * MIB,
            holders: RefCell::new(vec![holder(42, 2048)]),
        };
        let r = block_on(await_shared(
            &probe,
            &watch(vec![42]),
            64 * MIB,
            Duration::ZERO,
        ));
        assert_eq!(r.verdict, GpuVerdict::Leaked);
        assert!(r.note.unwrap().contains("pid 42 (python)"));
        // Gone from the list by the verdict (stopped), but it held memory at the main exit.
        let mut w = watch(vec![42]);
        let probe = Listed {
            used: 600 * MIB,
            holders: RefCell::new(vec![holder(42, 2048)]),
        };
        w.main_exited(&probe, 41, &|pid| pid == 41 || pid == 42);
        probe.holders.borrow_mut().clear();
        let r = block_on(await_shared(&probe, &w, 64 * MIB, Duration::ZERO));
        assert_eq!(r.verdict, GpuVerdict::Leaked);
        assert!(r.note.unwrap().contains("main process exited"));
    }

    #[test]
    fn the_main_process_still_listed_at_its_exit_is_waited_for_not_called_left_behind() {
        // The driver still lists the reaped main process (42) while it tears its context down.
        let mut w = watch(vec![42]);
        let probe = Listed {
            used: (600 + 2048) * MIB,
            holders: RefCell::new(vec![holder(42, 2048)]),
        };
        w.main_exited(&probe, 42, &|pid| pid == 42);
        assert_eq!(w.left_behind, None);
        // Gone from the list and its memory back by the verdict: clean.
        let probe = Listed {
            used: 600 * MIB,
            holders: RefCell::new(Vec::new()),
        };
        let r = block_on(await_shared(&probe, &w, 64 * MIB, Duration::ZERO));
        assert_eq!(r.verdict, GpuVerdict::Clean, "{r:?}");
    }

    /// A GPU whose list of processes changes at each read, as neighbours come and go.
    struct Churning {
        used: u64,
        lists: RefCell<Vec<Vec<Holder>>>,
    }

    impl MemoryProbe for Churning {
        fn used_bytes(&self, _: &str) -> Result<u64, ProbeError> {
            Ok(self.used)
        }
        fn holders(&self, _: &str) -> Vec<Holder> {
            self.lists.borrow_mut().remove(0)
        }
    }

    #[test]
    fn a_neighbour_listed_after_the_devices_figure_was_read_never_lowers_the_baseline() {
        // 600 MiB idle, neighbour 7 holds 1 GiB; neighbour 8 appears with 500 MiB just after
        // the device's figure was read (the figure does not have it yet), and 7 grows to
        // 1.5 GiB the same instant.
        let probe = Churning {
            used: (600 + 1024) * MIB,
            lists: RefCell::new(vec![
                vec![holder(7, 1024)],
                vec![holder(7, 1536), holder(8, 500)],
            ]),
        };
        assert_eq!(baseline_unlisted(&probe, "GPU-0"), Some(600 * MIB));
        // One read of each, in the other order, would have said 600 + 1024 - 2036 = 0 MiB:
        // the stage, judged later on the quiet GPU (600 MiB unlisted), would be `leaked`.
        let mut w = watch(vec![]);
        w.baseline = 600 * MIB;
        let quiet = Listed {
            used: 600 * MIB,
            holders: RefCell::new(Vec::new()),
        };
        let r = block_on(await_shared(&quiet, &w, 64 * MIB, Duration::ZERO));
        assert_eq!(r.verdict, GpuVerdict::Clean, "{r:?}");
    }

    #[test]
    fn unlisted_memory_above_the_baseline_is_a_leak_and_overuse_is_noted() {
        let probe = Listed {
            used: (600 + 1024 + 2048) * MIB,
            holders: RefCell::new(vec![holder(7, 2048)]),
        };
        let mut w = watch(vec![]);
        w.peak = 5000 * MIB;
        let r = block_on(await_shared(&probe, &w, 64 * MIB, Duration::ZERO));
        assert_eq!(r.verdict, GpuVerdict::Leaked);
        let note = r.note.unwrap();
        assert!(
            note.contains("1024 MiB above the stage's baseline"),
            "{note}"
        );
        assert!(
            note.contains("more than the 4096 MiB it declared"),
            "{note}"
        );
    }
}
