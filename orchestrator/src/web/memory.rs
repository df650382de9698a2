//! The web view's own record of GPU memory: every GPU sampled every [`PERIOD`], the last
//! [`KEPT`] samples of each kept in memory (bounded whatever the daemon runs), with Unix times so
//! that the page lays them beside the runs' events.

use super::metrics::GpuNow;
use crate::host::Host;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

/// How often each GPU is read.
pub const PERIOD: Duration = Duration::from_millis(250);
/// Samples kept per GPU (an hour at [`PERIOD`]).
pub const KEPT: usize = 14_400;

/// One GPU's samples: (Unix ms, used bytes).
#[derive(Debug, Default)]
pub struct Series {
    /// Its UUID.
    pub uuid: String,
    /// Its name.
    pub name: String,
    /// Total memory.
    pub total_bytes: u64,
    /// Oldest first.
    pub samples: VecDeque<(u64, u64)>,
    /// Its utilisation (percent) at the last sample, when the probe reads it.
    pub utilization: Option<u32>,
}

/// Every GPU's samples.
pub type Memory = Rc<RefCell<Vec<Series>>>;

/// Starts sampling the host's GPUs (nothing when it has none or no probe); ends with the
/// returned handle.
pub fn start(host: Rc<Host>) -> (Memory, Option<tokio::task::JoinHandle<()>>) {
    let memory: Memory = Rc::new(RefCell::new(
        host.gpus()
            .iter()
            .map(|g| Series {
                uuid: g.uuid.clone(),
                name: g.name.clone(),
                total_bytes: g.total_bytes,
                samples: VecDeque::new(),
                utilization: None,
            })
            .collect(),
    ));
    let Some(probe) = host.inventory.probe.clone() else {
        return (memory, None);
    };
    if host.gpus().is_empty() {
        return (memory, None);
    }
    let kept = memory.clone();
    let task = tokio::task::spawn_local(async move {
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let now = crate::timefmt::unix_ms();
            for series in kept.borrow_mut().iter_mut() {
                if let Ok(used) = probe.used_bytes(&series.uuid) {
                    if series.samples.len() == KEPT {
                        series.samples.pop_front();
                    }
                    series.samples.push_back((now, used));
                }
                series.utilization = probe.utilization(&series.uuid);
            }
        }
    });
    (memory, Some(task))
}

/// Each GPU now.
pub fn now(memory: &Memory, host: &Host) -> Vec<GpuNow> {
    memory
        .borrow()
        .iter()
        .map(|s| GpuNow {
            uuid: s.uuid.clone(),
            used_bytes: s.samples.back().map(|&(_, b)| b),
            baseline_bytes: host.idle_baseline(&s.uuid),
            quarantined: host.quarantined(&s.uuid),
        })
        .collect()
}

/// The machine's GPUs now, for the web view's machine panel: each one's name, memory in use
/// of its total, utilisation, idle baseline and whether it is quarantined.
pub fn machine(memory: &Memory, host: &Host) -> serde_json::Value {
    let gpus: Vec<serde_json::Value> = memory
        .borrow()
        .iter()
        .map(|s| {
            serde_json::json!({
                "uuid": s.uuid,
                "name": s.name,
                "total_bytes": s.total_bytes,
                "used_bytes": s.samples.back().map(|&(_, b)| b),
                "utilization": s.utilization,
                "baseline_bytes": host.idle_baseline(&s.uuid),
                "quarantined": host.quarantined(&s.uuid),
            })
        })
        .collect();
    serde_json::json!({ "gpus": gpus })
}

/// The samples of each GPU between `from_ms` and `to_ms`, thinned to at most `points` per GPU
/// (keeping each thinned window's highest reading, so peaks survive).
pub fn window(
    memory: &Memory,
    host: &Host,
    from_ms: u64,
    to_ms: u64,
    points: usize,
) -> serde_json::Value {
    let gpus: Vec<serde_json::Value> = memory
        .borrow()
        .iter()
        .map(|s| {
            let inside: Vec<(u64, u64)> = s
                .samples
                .iter()
                .copied()
                .filter(|&(t, _)| t >= from_ms && t <= to_ms)
                .collect();
            let step = inside.len().div_ceil(points.max(1)).max(1);
            let thinned: Vec<[u64; 2]> = inside
                .chunks(step)
                .map(|c| {
                    let top = c
                        .iter()
                        .max_by_key(|&&(_, b)| b)
                        .copied()
                        .unwrap_or_default();
                    [c[0].0, top.1]
                })
                .collect();
            serde_json::json!({
                "uuid": s.uuid,
                "name": s.name,
                "total_bytes": s.total_bytes,
                "baseline_bytes": host.idle_baseline(&s.uuid),
                "quarantined": host.quarantined(&s.uuid),
                "samples": thinned,
            })
        })
        .collect();
    serde_json::json!({ "period_ms": PERIOD.as_millis() as u64, "gpus": gpus })
}
