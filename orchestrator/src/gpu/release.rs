//! The release check: whether a stage that says its device work is over (its `released`
//! event) really gave its GPUs back, so that they can go to the next stage while its processes
//! still persist their outputs.
//!
//! Promise of [`check_release`]: it says yes only when, on every GPU of the stage, no process
//! of the stage's tree is listed by the probe and the used memory is back at the baseline
//! within the tolerance (the end-of-stage verdict's rule, [`super::await_reclaim`], applied
//! while the stage still runs). Anything else is a refusal that says why; a refusal changes
//! nothing (the ordinary check after the stage's end decides).

use super::attribution::Owner;
use super::{await_reclaim, Holder, MemoryProbe};
use protocol::report::GpuRecord;
use std::time::Duration;

/// How long the check waits for the memory to come back after the event (the driver shows
/// it back at once after the context is destroyed; this covers a reading taken a moment early).
pub const RELEASE_WAIT: Duration = Duration::from_millis(100);

/// One of a stage's GPUs as the checks need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuBaseline {
    /// The GPU.
    pub uuid: String,
    /// Its used memory before the stage started, bytes.
    pub baseline: u64,
    /// The most it was seen using while the stage ran, bytes.
    pub peak: u64,
}

/// Checks every GPU of `gpus` for a release by the stage whose processes `is_stage` tells
/// (by PID); the clean verdicts, marked as taken at release, or why the release does not hold.
/// `foreign` tells whose a process that is not the stage's is (for the memory's attribution).
pub async fn check_release(
    probe: &dyn MemoryProbe,
    gpus: &[GpuBaseline],
    tolerance: u64,
    is_stage: &dyn Fn(u32) -> bool,
    foreign: &dyn Fn(u32) -> Owner,
) -> Result<Vec<GpuRecord>, String> {
    let mut records = Vec::with_capacity(gpus.len());
    for GpuBaseline {
        uuid,
        baseline,
        peak,
    } in gpus
    {
        if let Some(h) = probe.holders(uuid).into_iter().find(|h| is_stage(h.pid)) {
            return Err(format!("{uuid} still lists {h}, a process of the stage"));
        }
        let owner = |pid| match is_stage(pid) {
            true => Owner::Ours,
            false => foreign(pid),
        };
        let v = await_reclaim(probe, uuid, *baseline, tolerance, RELEASE_WAIT, &owner).await;
        if let Some(error) = v.error {
            return Err(format!("{uuid} cannot be read: {error}"));
        }
        if !v.clean {
            let mut why = format!(
                "{uuid} is {} MiB above its baseline (tolerance {} MiB)",
                v.excess_bytes() >> 20,
                tolerance >> 20
            );
            if let Some(note) = v.note {
                why.push_str(&format!(": {note}"));
            }
            return Err(why);
        }
        // Clean (checked above), and taken at the release.
        records.push(GpuRecord {
            at_release: true,
            xids: Vec::new(),
            unhealthy: None,
            ..v.record(*peak)
        });
    }
    Ok(records)
}

/// A process of the stage that the probe lists on one of `uuids` after the stage released
/// them (it touched a GPU again): the GPU and the process, if there is one.
pub fn touched_again(
    probe: &dyn MemoryProbe,
    uuids: &[String],
    is_stage: &dyn Fn(u32) -> bool,
) -> Option<(String, Holder)> {
    uuids.iter().find_map(|uuid| {
        probe
            .holders(uuid)
            .into_iter()
            .find(|h| is_stage(h.pid))
            .map(|h| (uuid.clone(), h))
    })
}

#[cfg(test)]
mod tests {
    use super::super::ProbeError;
    use super::*;
    use protocol::report::GpuVerdict;
    use std::cell::RefCell;

    struct Fixed {
        used: RefCell<u64>,
        holders: Vec<Holder>,
    }

    impl MemoryProbe for Fixed {
        fn used_bytes(&self, _uuid: &str) -> Result<u64, ProbeError> {
            Ok(*self.used.borrow())
        }
        fn holders(&self, _uuid: &str) -> Vec<Holder> {
            self.holders.clone()
        }
    }

    fn holder(pid: u32, bytes: u64) -> Holder {
        Holder {
            pid,
            name: "python".into(),
            bytes: Some(bytes),
        }
    }

    const MIB: u64 = 1 << 20;

    fn gpus() -> Vec<GpuBaseline> {
        vec![GpuBaseline {
            uuid: "GPU-0".into(),
            baseline: 600 * MIB,
            peak: 9000 * MIB,
        }]
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(f)
    }

    #[test]
    fn memory_back_and_no_process_of_the_stage_listed_holds() {
        let probe = Fixed {
            used: RefCell::new(602 * MIB),
            holders: Vec::new(),
        };
        let records = block_on(check_release(&probe, &gpus(), 4 * MIB, &|_| true, &|_| {
            Owner::Foreign
        }))
        .expect("holds");
        assert_eq!(records.len(), 1);
        let r = &records[0];
        assert!(r.at_release && r.verdict == GpuVerdict::Clean);
        assert_eq!((r.after_bytes, r.peak_bytes), (602 * MIB, 9000 * MIB));
    }

    #[test]
    fn a_process_of_the_stage_still_listed_is_refused_even_with_the_memory_back() {
        let probe = Fixed {
            used: RefCell::new(600 * MIB),
            holders: vec![holder(42, 0)],
        };
        let why = block_on(check_release(
            &probe,
            &gpus(),
            4 * MIB,
            &|pid| pid == 42,
            &|_| Owner::Foreign,
        ))
        .unwrap_err();
        assert!(
            why.contains("pid 42") && why.contains("a process of the stage"),
            "{why}"
        );
    }

    #[test]
    fn memory_above_the_baseline_is_refused_whoever_holds_it() {
        // Nobody listed: the stage's own context, not yet gone.
        let probe = Fixed {
            used: RefCell::new(1624 * MIB),
            holders: Vec::new(),
        };
        let why = block_on(check_release(&probe, &gpus(), 4 * MIB, &|_| false, &|_| {
            Owner::Foreign
        }))
        .unwrap_err();
        assert!(why.contains("1024 MiB above its baseline"), "{why}");
        // Someone else's process took it meanwhile: the GPU is not free to hand on either.
        let probe = Fixed {
            used: RefCell::new(1624 * MIB),
            holders: vec![holder(7, 1024 * MIB)],
        };
        let why = block_on(check_release(&probe, &gpus(), 4 * MIB, &|_| false, &|_| {
            Owner::Foreign
        }))
        .unwrap_err();
        assert!(why.contains("outside the stage's tree"), "{why}");
    }

    #[test]
    fn a_process_of_the_stage_back_on_a_released_gpu_is_named() {
        let probe = Fixed {
            used: RefCell::new(0),
            holders: vec![holder(7, MIB), holder(42, MIB)],
        };
        let uuids = vec!["GPU-0".to_string()];
        assert_eq!(touched_again(&probe, &uuids, &|pid| pid == 99), None);
        let (uuid, found) = touched_again(&probe, &uuids, &|pid| pid == 42).expect("found");
        assert_eq!((uuid.as_str(), found.pid), ("GPU-0", 42));
    }
}
