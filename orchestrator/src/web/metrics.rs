//! `/metrics`: the daemon in the Prometheus text format (version 0.0.4).
//!
//! Labels are bounded by construction: `state` and `status` take the values of the status
//! enums, `gpu` the GPUs of the host. No run, stage or attempt is ever a label, so a sweep of
//! any size adds no series.

use crate::daemon::tally::RECLAIM_BUCKETS_S;
use crate::daemon::Daemon;
use protocol::status::{RunStatus, StageStatus};
use std::collections::BTreeMap;
use std::fmt::Write;

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
    gpu_queue(&mut out, daemon, gpus);
    out
}

/// Why stages wait for GPUs (a stage counts once under each kind of reason it was given) and
/// which GPUs are reserved for a waiting stage.
fn gpu_queue(out: &mut String, daemon: &Daemon, gpus: &[GpuNow]) {
    let (waiting, reserved) = daemon.host.gpu_queue_now();
    let mut by_reason: BTreeMap<&str, u64> = crate::host::GPU_WAIT_KINDS
        .iter()
        .map(|k| (*k, 0))
        .collect();
    for (_, kinds) in &waiting {
        for kind in kinds {
            *by_reason.entry(kind).or_default() += 1;
        }
    }
    family(
        out,
        "orchestrate_stages_waiting_for_gpus",
        "gauge",
        "Stages waiting for GPUs, by kind of reason (held by another process, busy with a stage, reserved for an earlier stage, quarantined, ...).",
    );
    for (reason, n) in &by_reason {
        let _ = writeln!(
            out,
            "orchestrate_stages_waiting_for_gpus{{reason=\"{reason}\"}} {n}"
        );
    }
    family(
        out,
        "orchestrate_gpu_reserved",
        "gauge",
        "1 when the GPU is reserved for a waiting stage: no stage after it in the queue takes it.",
    );
    for g in gpus {
        let is = reserved.iter().any(|(u, _)| *u == g.uuid);
        let _ = writeln!(
            out,
            "orchestrate_gpu_reserved{{gpu=\"{}\"}} {}",
            label(&g.uuid),
            u8::from(is)
        );
    }
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

    #[test]
    fn labels_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
