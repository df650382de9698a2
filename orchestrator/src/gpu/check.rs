//! `orchestrate gpu-check`: the memory check as a standalone command, for Slurm prolog and
//! epilog scripts and for checking every node of a multi-node stage.

use super::{discover, GpuInfo, Inventory, MemoryProbe, NvmlUnavailable};
use std::time::{Duration, Instant};

pub use protocol::gpu_check::{CheckResult, GpuState};

fn read(probe: &dyn MemoryProbe, gpus: &[GpuInfo], max_used: u64) -> Vec<GpuState> {
    gpus.iter()
        .map(|g| {
            let used = probe.used_bytes(&g.uuid).unwrap_or(u64::MAX);
            let holders = probe.holders(&g.uuid);
            GpuState {
                index: g.index,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
                total_bytes: g.total_bytes,
                used_bytes: used,
                clean: holders.is_empty() && used <= max_used,
                processes: holders.iter().map(|h| h.to_string()).collect(),
            }
        })
        .collect()
}

/// Takes a snapshot; with `wait`, polls until every GPU is clean or `timeout` passes.
/// `Err` says why NVML could not be used.
pub fn run(max_used_bytes: u64, wait: Option<Duration>) -> Result<CheckResult, NvmlUnavailable> {
    let (gpus, probe, driver, order) = match discover() {
        Inventory::Available {
            gpus,
            probe,
            driver,
            order,
        } => (gpus, probe, driver, order),
        Inventory::Unavailable(why) => return Err(why),
    };
    let start = Instant::now();
    let mut states = Vec::new();
    crate::process::backoff::poll_blocking(
        wait.unwrap_or(Duration::ZERO),
        Duration::from_millis(100),
        || {
            states = read(probe.as_ref(), &gpus, max_used_bytes);
            states.iter().all(|s| s.clean)
        },
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    Ok(CheckResult {
        v: protocol::PROTOCOL_VERSION,
        host,
        driver,
        max_used_bytes,
        clean: states.iter().all(|s| s.clean),
        gpus: states,
        waited_ms: start.elapsed().as_secs_f64() * 1e3,
        order_note: order.note(),
    })
}

/// A table for people.
pub fn render_text(result: &CheckResult) -> String {
    let mut out = format!("{} (driver {})\n", result.host, result.driver);
    for g in &result.gpus {
        out.push_str(&format!(
            "GPU {} {} {}: {} / {} MiB used, {}{}\n",
            g.index,
            g.name,
            g.uuid,
            g.used_bytes / (1 << 20),
            g.total_bytes / (1 << 20),
            if g.clean { "clean" } else { "NOT clean" },
            if g.processes.is_empty() {
                String::new()
            } else {
                format!(" ({})", g.processes.join(", "))
            }
        ));
    }
    if result.gpus.is_empty() {
        out.push_str("NVML lists no GPU\n");
    }
    if let Some(note) = &result.order_note {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}
