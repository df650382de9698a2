//! `stage-worker hold`: a GPU memory fixture for benchmarks and leak tests. It takes a given
//! amount of device memory (written once, so it is really resident), optionally says so in a
//! file, holds it for a while and exits, leaving the release of the memory to the process's
//! end: exactly what a stage's worker does, without the training.

use std::path::PathBuf;
use std::time::Duration;
use tch::{Device, Kind, Tensor};

/// Arguments of `stage-worker hold`.
#[derive(Debug, clap::Args)]
pub struct HoldArgs {
    /// GiB of device memory to take on cuda:0 (fractions allowed).
    #[arg(long)]
    pub gib: f64,
    /// Seconds to hold it before exiting.
    #[arg(long, default_value_t = 0.0)]
    pub seconds: f64,
    /// A file to create once the memory is taken.
    #[arg(long, value_name = "PATH")]
    pub ready_file: Option<PathBuf>,
}

/// Takes the memory, holds it, returns (the process then exits).
pub fn run(args: &HoldArgs) -> Result<(), String> {
    if !tch::Cuda::is_available() {
        return Err("no CUDA device is available to hold memory on".into());
    }
    if !(args.gib.is_finite() && args.gib > 0.0) {
        return Err(format!("--gib must be a positive number, not {}", args.gib));
    }
    let bytes = (args.gib * (1u64 << 30) as f64) as i64;
    let held = Tensor::ones([bytes], (Kind::Uint8, Device::Cuda(0)));
    tch::Cuda::synchronize(0);
    eprintln!("stage-worker hold: holding {} GiB on cuda:0", args.gib);
    if let Some(path) = &args.ready_file {
        std::fs::write(path, b"ready\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    std::thread::sleep(Duration::from_secs_f64(args.seconds.max(0.0)));
    drop(held);
    Ok(())
}
