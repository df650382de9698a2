//! GPU memory over a whole run: sampled at a steady rate into `gpu-timeline.csv`, with the
//! stage spans kept beside, and drawn as `gpu-memory.svg` at the end.

use super::{GpuInfo, MemoryProbe};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// One stage attempt on one GPU, for the picture.
#[derive(Debug, Clone, PartialEq)]
pub struct StageSpan {
    /// Stage name.
    pub stage: String,
    /// The GPU.
    pub uuid: String,
    /// Seconds since the run started.
    pub start_s: f64,
    /// Seconds since the run started (the verdict).
    pub end_s: f64,
    /// Used bytes before the stage.
    pub baseline_bytes: u64,
    /// Whether the stage's verdict was clean.
    pub clean: bool,
}

/// One reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds since the run started.
    pub t_s: f64,
    /// Index into the run's GPU list.
    pub gpu: usize,
    /// Used bytes.
    pub used_bytes: u64,
}

/// Starts sampling every GPU every `period` into `csv` (header `t_s,gpu_index,uuid,used_bytes`).
/// The task ends when the returned handle is dropped or aborted.
pub fn start_sampler(
    probe: Rc<dyn MemoryProbe>,
    gpus: Vec<GpuInfo>,
    csv: PathBuf,
    origin: Instant,
    period: Duration,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(&csv)?);
    writeln!(out, "t_s,gpu_index,uuid,used_bytes")?;
    Ok(tokio::task::spawn_local(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let t = origin.elapsed().as_secs_f64();
            for (i, g) in gpus.iter().enumerate() {
                if let Ok(used) = probe.used_bytes(&g.uuid) {
                    let _ = writeln!(out, "{t:.4},{i},{},{used}", g.uuid);
                }
            }
            let _ = out.flush();
        }
    }))
}

/// Reads the samples back from `gpu-timeline.csv` (malformed lines are skipped).
pub fn read_samples(csv: &Path) -> Vec<Sample> {
    let Ok(file) = std::fs::File::open(csv) else {
        return Vec::new();
    };
    std::io::BufReader::new(file)
        .lines()
        .skip(1)
        .map_while(Result::ok)
        .filter_map(|line| {
            let mut f = line.split(',');
            let t_s = f.next()?.parse().ok()?;
            let gpu = f.next()?.parse().ok()?;
            let _uuid = f.next()?;
            let used_bytes = f.next()?.parse().ok()?;
            Some(Sample {
                t_s,
                gpu,
                used_bytes,
            })
        })
        .collect()
}
