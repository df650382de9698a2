//! Waiting for a GPU to come back to its baseline after a stage, and the verdict.

use super::attribution::{attribute, Attribution, Owner};
use super::{Holder, MemoryProbe};
use std::time::{Duration, Instant};

/// The outcome for one GPU after a stage's processes are all gone.
#[derive(Debug, Clone, PartialEq)]
pub struct ReclaimVerdict {
    /// The GPU.
    pub uuid: String,
    /// Used bytes before the stage.
    pub baseline_bytes: u64,
    /// Used bytes at the last reading.
    pub after_bytes: u64,
    /// Time from the call to the first clean reading (or to the timeout).
    pub reclaim: Duration,
    /// Whether the GPU came back within tolerance.
    pub clean: bool,
    /// Not clean, but only because processes outside the stage's tree hold the memory
    /// (`super::attribution`): not the stage's leak.
    pub taken_by_other: bool,
    /// When not clean: who holds memory now.
    pub holders: Vec<Holder>,
    /// When not clean: why the memory is, or is not, the stage's.
    pub note: Option<String>,
    /// The last reading's error, as the report words it, if readings failed (text: the
    /// verdict is cloned and compared, which the probe's error is not).
    pub error: Option<String>,
}

impl ReclaimVerdict {
    /// Bytes above baseline at the verdict.
    pub fn excess_bytes(&self) -> u64 {
        self.after_bytes.saturating_sub(self.baseline_bytes)
    }

    /// The report's record of this GPU, whose highest reading during the stage was `peak`:
    /// clean, taken by another, or leaked, as the verdict says.
    pub fn record(&self, peak: u64) -> protocol::report::GpuRecord {
        use protocol::report::GpuVerdict;
        protocol::report::GpuRecord {
            uuid: self.uuid.clone(),
            baseline_bytes: self.baseline_bytes,
            peak_bytes: peak.max(self.after_bytes),
            after_bytes: self.after_bytes,
            reclaim_ms: self.reclaim.as_secs_f64() * 1e3,
            verdict: if self.clean {
                GpuVerdict::Clean
            } else if self.taken_by_other {
                GpuVerdict::TakenByOther
            } else {
                GpuVerdict::Leaked
            },
            holders: self.holders.iter().map(|h| h.to_string()).collect(),
            note: self.note.clone(),
            at_release: false,
            xids: Vec::new(),
            unhealthy: None,
        }
    }
}

/// Polls `probe` until `uuid` is back within `tolerance` bytes of `baseline`, or until the
/// memory above it is held only by processes that `owner` says are foreign (waiting does not
/// give that back), or `timeout` passes. The first reading is taken at once (the common case:
/// memory is already back when the last process is reaped); later ones back off from 1 ms to
/// 20 ms.
pub async fn await_reclaim(
    probe: &dyn MemoryProbe,
    uuid: &str,
    baseline: u64,
    tolerance: u64,
    timeout: Duration,
    owner: &dyn Fn(u32) -> Owner,
) -> ReclaimVerdict {
    let start = Instant::now();
    let mut last = baseline;
    let mut error: Option<String> = None;
    let mut clean = false;
    let mut taken = false;
    crate::process::backoff::poll(timeout, Duration::from_millis(20), || {
        match probe.used_bytes(uuid) {
            Ok(used) => {
                (last, error) = (used, None);
                clean = used <= baseline.saturating_add(tolerance);
                taken = !clean
                    && attribute(used - baseline, tolerance, &probe.holders(uuid), owner)
                        == Attribution::TakenByOther;
                clean || taken
            }
            Err(e) => {
                error = Some(e.to_string());
                false
            }
        }
    })
    .await;
    let reclaim = start.elapsed();
    let (holders, note) = if clean {
        (Vec::new(), None)
    } else {
        let holders = probe.holders(uuid);
        let excess = last.saturating_sub(baseline);
        let note = match attribute(excess, tolerance, &holders, owner) {
            Attribution::TakenByOther => {
                taken = true;
                Some("held only by processes outside the stage's tree".to_string())
            }
            Attribution::Stage(why) => {
                taken = false;
                why
            }
        };
        (holders, note)
    };
    ReclaimVerdict {
        uuid: uuid.to_string(),
        baseline_bytes: baseline,
        after_bytes: last,
        reclaim,
        clean,
        taken_by_other: taken && error.is_none(),
        holders,
        note,
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::super::ProbeError;
    use super::*;
    use std::cell::RefCell;

    /// Replays recorded readings (`None`: the GPU is gone); the last one repeats forever.
    struct Recorded {
        samples: RefCell<Vec<Option<u64>>>,
        holders: Vec<Holder>,
    }

    impl Recorded {
        fn new(samples: Vec<Option<u64>>) -> Self {
            let mut samples = samples;
            samples.reverse();
            Recorded {
                samples: RefCell::new(samples),
                holders: vec![Holder {
                    pid: 77,
                    name: "python".into(),
                    bytes: Some(4 << 30),
                }],
            }
        }
    }

    impl MemoryProbe for Recorded {
        fn used_bytes(&self, uuid: &str) -> Result<u64, ProbeError> {
            let mut s = self.samples.borrow_mut();
            let sample = if s.len() > 1 { s.pop().unwrap() } else { s[0] };
            sample.ok_or_else(|| ProbeError::UnknownGpu {
                uuid: uuid.to_string(),
            })
        }
        fn holders(&self, _: &str) -> Vec<Holder> {
            self.holders.clone()
        }
    }

    const MIB: u64 = 1 << 20;

    fn run(probe: &Recorded, tolerance: u64, timeout_ms: u64) -> ReclaimVerdict {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(await_reclaim(
            probe,
            "GPU-x",
            615 * MIB,
            tolerance,
            Duration::from_millis(timeout_ms),
            &|pid| {
                if pid == 77 {
                    Owner::Ours
                } else {
                    Owner::Foreign
                }
            },
        ))
    }

    #[test]
    fn clean_at_first_reading() {
        let v = run(&Recorded::new(vec![Some(615 * MIB)]), 64 * MIB, 1000);
        assert!(v.clean);
        assert_eq!(v.after_bytes, 615 * MIB);
        assert!(v.reclaim < Duration::from_millis(50));
        assert!(v.holders.is_empty());
    }

    #[test]
    fn within_tolerance_is_clean_above_is_not() {
        assert!(run(&Recorded::new(vec![Some(679 * MIB)]), 64 * MIB, 50).clean);
        let v = run(&Recorded::new(vec![Some(680 * MIB)]), 64 * MIB, 50);
        assert!(!v.clean);
        assert_eq!(v.excess_bytes(), 65 * MIB);
    }

    #[test]
    fn waits_for_memory_that_comes_back_late() {
        let v = run(
            &Recorded::new(vec![
                Some(8000 * MIB),
                Some(4000 * MIB),
                Some(700 * MIB),
                Some(615 * MIB),
            ]),
            0,
            2000,
        );
        assert!(v.clean);
        assert_eq!(v.after_bytes, 615 * MIB);
    }

    #[test]
    fn leak_after_timeout_names_holders() {
        let v = run(&Recorded::new(vec![Some(7577 * MIB)]), 64 * MIB, 100);
        assert!(!v.clean);
        assert!(v.reclaim >= Duration::from_millis(100));
        assert_eq!(v.after_bytes, 7577 * MIB);
        assert_eq!(v.holders[0].pid, 77);
        assert!(v.holders[0].to_string().contains("python"));
    }

    #[test]
    fn memory_held_by_someone_else_ends_the_wait_at_once_and_is_not_a_leak() {
        let mut probe = Recorded::new(vec![Some(615 * MIB + (3682 << 20))]);
        probe.holders = vec![Holder {
            pid: 815,
            name: "python3".into(),
            bytes: Some(3682 * MIB),
        }];
        let v = run(&probe, 64 * MIB, 5000);
        assert!(!v.clean);
        assert!(v.taken_by_other);
        assert!(v.reclaim < Duration::from_millis(1000), "{:?}", v.reclaim);
        assert_eq!(v.holders[0].pid, 815);
        // The same memory held by a process of ours stays a leak.
        let v = run(
            &Recorded::new(vec![Some(615 * MIB + (4 << 30))]),
            64 * MIB,
            50,
        );
        assert!(!v.taken_by_other);
        assert!(v.note.unwrap().contains("pid 77"));
    }

    #[test]
    fn probe_errors_end_in_a_verdict_that_says_so() {
        let v = run(&Recorded::new(vec![None]), 64 * MIB, 30);
        assert!(!v.clean);
        assert_eq!(v.error.as_deref(), Some("unknown GPU GPU-x"));
    }
}
