//! GPU faults in a stage's verdict: the XIDs the driver reported for its GPUs while it ran
//! ([`crate::gpu::health`]), each with NVIDIA's meaning and recovery action, said on the
//! console, and its error counters read again after it (a GPU they refuse is named in the
//! verdict; the health gate keeps it from the next stage). A GPU hit by an XID whose recovery needs a reset or a reboot is quarantined by the
//! run (no later stage is placed on it), and inside a Slurm allocation this node is drained
//! with the reason.

use crate::attempt::launch::{AttemptPlan, Services};
use crate::gpu::MemoryProbe;
use protocol::report::GpuRecord;
use std::time::Duration;

/// When the attempt ran, in Unix seconds, and whether it failed.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Its first process was spawned.
    pub spawned: f64,
    /// Its first process exited.
    pub exited: f64,
    /// It did not end cleanly (exit 0, not stopped).
    pub failed: bool,
}

/// How long after a failed attempt's exit an XID may still arrive: on an H200 the driver
/// reported XID 31 0.58 s after the faulting process got its CUDA error.
const LATE_XID: Duration = Duration::from_millis(1500);

/// Adds to `records` (the attempt's GPU verdicts) the XIDs reported for its GPUs since it
/// was spawned, waiting up to [`LATE_XID`] after a failed attempt's exit for late ones, and
/// what their error counters say now, when they refuse the GPU (the health gate's reasons).
pub async fn attach(
    plan: &AttemptPlan,
    probe: &dyn MemoryProbe,
    records: &mut [GpuRecord],
    window: Window,
    services: &Services,
) {
    if records.is_empty() {
        return;
    }
    if window.failed {
        let late = window.exited + LATE_XID.as_secs_f64() - crate::timefmt::unix_secs_f64();
        if late > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(late)).await;
        }
    }
    let mut drain = Vec::new();
    for record in records.iter_mut() {
        for (at, xid) in probe.xids_since(&record.uuid, window.spawned) {
            let x = crate::gpu::health::xid_record(xid, at);
            let mut line = format!(
                "{}: GPU {}: {}",
                plan.name,
                record.uuid,
                crate::gpu::health::describe(&x)
            );
            if x.needs_reset {
                line.push_str("; the GPU is quarantined: no further stage runs on it");
                drain.push(format!("orchestrate: XID {xid} on {}", record.uuid));
            }
            services.events.warn(&line);
            record.xids.push(x);
        }
        record.unhealthy = probe
            .counters(&record.uuid)
            .and_then(|c| crate::gpu::health::refusal(&c));
        if let Some(why) = &record.unhealthy {
            services.events.warn(&format!(
                "{}: GPU {} after the stage: {why}; no stage gets it until a reset clears them",
                plan.name, record.uuid
            ));
        }
    }
    if let (Some(reason), Some(allocation)) = (drain.first(), crate::slurm::Allocation::detect()) {
        let node = allocation.host;
        match crate::slurm::drain::drain_node(&services.reaper, &node, reason).await {
            Ok(()) => services.events.warn(&format!(
                "{}: drained Slurm node {node} ({reason})",
                plan.name
            )),
            Err(why) => services.events.warn(&format!(
                "{}: could not drain Slurm node {node} ({reason}): {why}",
                plan.name
            )),
        }
    }
}
