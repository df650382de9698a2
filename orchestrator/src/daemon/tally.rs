//! What the daemon counts from its runs' events since it started: stage attempts finished by
//! status, GPU verdicts, quarantines, reclaim times, and the GPUs each run was placed on.
//! Bounded by the statuses and the GPUs, whatever the daemon runs (`/metrics` exposes it).

use protocol::daemon::{RunEvent, RunEventKind};
use protocol::report::GpuVerdict;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Upper bounds of the reclaim-time histogram's buckets, seconds.
pub const RECLAIM_BUCKETS_S: [f64; 10] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// What the daemon counts from its runs' events since it started.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Stage attempts finished, by status.
    pub finished: BTreeMap<&'static str, u64>,
    /// GPUs whose memory did not come back to the baseline because of the stage.
    pub leaks: u64,
    /// GPUs held by processes outside the stage's tree at the verdict.
    pub taken_by_other: u64,
    /// GPUs quarantined.
    pub quarantines: u64,
    /// Reclaim times: count per bucket of [`RECLAIM_BUCKETS_S`] (not cumulative).
    pub reclaim_buckets: [u64; RECLAIM_BUCKETS_S.len()],
    /// Reclaim times: their sum, seconds.
    pub reclaim_sum_s: f64,
    /// Reclaim times: how many.
    pub reclaim_count: u64,
    /// The GPUs each run's stages were placed on (for the runs list; bounded by the GPUs).
    gpus: HashMap<String, BTreeSet<String>>,
}

impl Tally {
    /// The GPUs run `id`'s stages were placed on, as far as this daemon saw.
    pub fn gpus_of(&self, id: &str) -> Vec<String> {
        self.gpus
            .get(id)
            .map(|g| g.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Counts one event of run `run`.
    pub fn record(&mut self, run: &str, event: &RunEvent) {
        match &event.kind {
            RunEventKind::StageStarted { placement, .. } => {
                // "GPU 0 (GPU-…), GPU 1 (GPU-…)", or "cpu".
                for part in placement.split(", ") {
                    if let Some(uuid) = part.split_once('(').and_then(|(_, r)| r.strip_suffix(')'))
                    {
                        self.gpus
                            .entry(run.to_string())
                            .or_default()
                            .insert(uuid.to_string());
                    }
                }
            }
            RunEventKind::StageFinished { status, .. } => {
                *self.finished.entry(status.as_str()).or_default() += 1;
            }
            RunEventKind::GpuNotReclaimed { verdict, .. } => match verdict {
                GpuVerdict::Leaked => self.leaks += 1,
                GpuVerdict::TakenByOther => self.taken_by_other += 1,
                GpuVerdict::Clean => {}
            },
            RunEventKind::GpuQuarantined { .. } => self.quarantines += 1,
            RunEventKind::StageGpu { gpus, .. } => {
                for g in gpus {
                    let s = g.reclaim_ms / 1e3;
                    if !s.is_finite() || s < 0.0 {
                        continue;
                    }
                    if let Some(i) = RECLAIM_BUCKETS_S.iter().position(|&b| s <= b) {
                        self.reclaim_buckets[i] += 1;
                    }
                    self.reclaim_sum_s += s;
                    self.reclaim_count += 1;
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::report::GpuRecord;

    fn gpu_event(ms: f64) -> RunEvent {
        RunEvent {
            t_ms: 0,
            kind: RunEventKind::StageGpu {
                stage: "s".into(),
                attempt: 1,
                gpus: vec![GpuRecord {
                    uuid: "GPU-0".into(),
                    baseline_bytes: 1,
                    peak_bytes: 2,
                    after_bytes: 1,
                    reclaim_ms: ms,
                    verdict: GpuVerdict::Clean,
                    holders: Vec::new(),
                    note: None,
                    at_release: false,
                    xids: Vec::new(),
                    unhealthy: None,
                }],
            },
        }
    }

    #[test]
    fn reclaim_times_fall_in_their_buckets() {
        let mut t = Tally::default();
        for ms in [5.0, 40.0, 40.0, 100_000.0] {
            t.record("r", &gpu_event(ms));
        }
        assert_eq!(t.reclaim_buckets[0], 1);
        assert_eq!(t.reclaim_buckets[1], 2);
        assert_eq!(
            t.reclaim_buckets.iter().sum::<u64>(),
            3,
            "over 30 s is only in +Inf"
        );
        assert_eq!(t.reclaim_count, 4);
        assert!((t.reclaim_sum_s - 100.085).abs() < 1e-9);
    }
}
