//! `/metrics`: the daemon in the Prometheus text format (version 0.0.4).
//!
//! Labels are bounded by construction: `state` and `status` take the values of the status
//! enums, `gpu` the GPUs of the host. No run, stage or attempt is ever a label, so a sweep of
//! any size adds no series.

use crate::daemon::Daemon;
use protocol::daemon::{RunEvent, RunEventKind};
use protocol::report::GpuVerdict;
use protocol::status::{RunStatus, StageStatus};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;

/// Upper bounds of the reclaim-time histogram's buckets, seconds.
pub const RECLAIM_BUCKETS_S: [f64; 10] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// What the daemon counts from its runs' events since it started.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Stage attempts finished, by status.
    finished: BTreeMap<&'static str, u64>,
    /// GPUs whose memory did not come back to the baseline because of the stage.
    leaks: u64,
    /// GPUs held by processes outside the stage's tree at the verdict.
    taken_by_other: u64,
    /// GPUs quarantined.
    quarantines: u64,
    /// Reclaim times: count per bucket (not cumulative), then the sum and count.
    reclaim_buckets: [u64; RECLAIM_BUCKETS_S.len()],
    reclaim_sum_s: f64,
    reclaim_count: u64,
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

/// One GPU's figures for the page and `/metrics`.
#[derive(Debug, Clone)]
pub struct GpuNow {
    /// UUID.
    pub uuid: String,
    /// Used bytes at the last sample.
    pub used_bytes: Option<u64>,
    /// Idle baseline.
    pub baseline_bytes: Option<u64>,
    /// Quarantined.
    pub quarantined: bool,
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The exposition of the daemon now.
pub fn render(daemon: &Daemon, gpus: &[GpuNow]) -> String {
    let mut out = String::new();
    let mut runs: BTreeMap<&str, u64> = RunStatus::ALL.iter().map(|s| (s.as_str(), 0)).collect();
    let mut stages: BTreeMap<&str, u64> = ["pending", "waiting", "running", "succeeded"]
        .into_iter()
        .map(|s| (s, 0))
        .collect();
    for run in daemon.registry.borrow().all() {
        *runs.entry(run.state.as_str()).or_default() += 1;
        if run.finished() {
            continue;
        }
        let info = run.info();
        let waiting = info.waiting.len();
        let pending = info
            .stages
            .saturating_sub(info.succeeded + info.running + waiting);
        for (state, n) in [
            ("pending", pending),
            ("waiting", waiting),
            ("running", info.running),
            ("succeeded", info.succeeded),
        ] {
            *stages.entry(state).or_default() += n as u64;
        }
    }
    family(
        &mut out,
        "orchestrate_runs",
        "gauge",
        "Runs of this daemon, by state.",
    );
    for (state, n) in &runs {
        let _ = writeln!(out, "orchestrate_runs{{state=\"{state}\"}} {n}");
    }
    family(
        &mut out,
        "orchestrate_stages",
        "gauge",
        "Stages of the runs not finished, by state.",
    );
    for (state, n) in &stages {
        let _ = writeln!(out, "orchestrate_stages{{state=\"{state}\"}} {n}");
    }
    let tally = daemon.tally.borrow();
    family(
        &mut out,
        "orchestrate_stage_attempts_finished_total",
        "counter",
        "Stage attempts finished since the daemon started, by status.",
    );
    for status in StageStatus::ALL {
        let n = tally.finished.get(status.as_str()).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "orchestrate_stage_attempts_finished_total{{status=\"{status}\"}} {n}"
        );
    }
    for (name, help, n) in [
        ("orchestrate_gpu_leaks_total", "GPU verdicts `leaked` since the daemon started: memory the stage left behind.", tally.leaks),
        ("orchestrate_gpu_taken_by_other_total", "GPU verdicts `taken_by_other` since the daemon started: memory held outside the stage's tree.", tally.taken_by_other),
        ("orchestrate_gpu_quarantines_total", "GPUs quarantined since the daemon started.", tally.quarantines),
    ] {
        family(&mut out, name, "counter", help);
        let _ = writeln!(out, "{name} {n}");
    }
    let name = "orchestrate_gpu_reclaim_seconds";
    family(
        &mut out,
        name,
        "histogram",
        "From a stage's last process gone to its GPU's memory back at the baseline.",
    );
    let mut cumulative = 0;
    for (bound, n) in RECLAIM_BUCKETS_S.iter().zip(tally.reclaim_buckets) {
        cumulative += n;
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", tally.reclaim_count);
    let _ = writeln!(out, "{name}_sum {}", tally.reclaim_sum_s);
    let _ = writeln!(out, "{name}_count {}", tally.reclaim_count);
    family(
        &mut out,
        "orchestrate_gpu_used_bytes",
        "gauge",
        "Used memory of each GPU at the last sample.",
    );
    for g in gpus {
        if let Some(b) = g.used_bytes {
            let _ = writeln!(
                out,
                "orchestrate_gpu_used_bytes{{gpu=\"{}\"}} {b}",
                label(&g.uuid)
            );
        }
    }
    family(
        &mut out,
        "orchestrate_gpu_baseline_bytes",
        "gauge",
        "Idle baseline of each GPU: the lowest used memory seen with no process on it.",
    );
    for g in gpus {
        if let Some(b) = g.baseline_bytes {
            let _ = writeln!(
                out,
                "orchestrate_gpu_baseline_bytes{{gpu=\"{}\"}} {b}",
                label(&g.uuid)
            );
        }
    }
    family(
        &mut out,
        "orchestrate_gpu_quarantined",
        "gauge",
        "1 when no further stage is placed on the GPU.",
    );
    for g in gpus {
        let _ = writeln!(
            out,
            "orchestrate_gpu_quarantined{{gpu=\"{}\"}} {}",
            label(&g.uuid),
            u8::from(g.quarantined)
        );
    }
    out
}

/// A label value escaped as the text format wants.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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

    #[test]
    fn labels_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
