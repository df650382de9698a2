//! The end of a `train` stage, for either model (the byte-level GPT or a Llama): the final
//! checkpoint written, the device given back as soon as its data is on the host where that is
//! wanted, the files reported, then the metrics.

use super::milestones::Milestones;
use crate::checkpoint::fsio::WrittenFile;
use crate::device::{self, Compute, Released};
use crate::events::EventSink;
use crate::failure::{Failure, StageResult};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// Where a training ended.
pub struct Ending {
    /// Whether every planned step was taken (else a stop signal ended it).
    pub complete: bool,
    /// The optimizer's step count.
    pub step: u64,
    /// Steps the stage planned.
    pub total_steps: u64,
    /// When the first step of this attempt was done.
    pub after_first: Option<Instant>,
    /// When the last step was done.
    pub finished: Instant,
    /// The training's metrics so far.
    pub metrics: BTreeMap<String, f64>,
    /// The stage's milestones so far.
    pub milestones: Milestones,
}

/// Whether a training that ended so should give its device back early: at its final
/// checkpoint's copies, on a device where that is wanted (see [`device::early_release_wanted`]).
/// A stage for which this holds sends `finishing` once its last step is done.
pub fn releases_early(complete: bool, compute: &Compute) -> bool {
    complete && device::early_release_wanted(compute.device)
}

/// Writes the final checkpoint with `write`, given `on_device` (what lives on the device: the
/// model, its optimizer, any tensor left) and the slot for a release where one is wanted
/// ([`releases_early`]); reports its files; then a complete training's metrics, with
/// `checkpoint_write_s`, the milestones (`t_device_released` when the device was given back,
/// `t_checkpoint_durable`, `t_first_step`, `t_last_step`), each file's phases (`t_copied_*`
/// … `t_synced_*`) and, on CUDA, `fused_adamw` and `pinned_buffers`. An interrupted training
/// fails as such once its checkpoint is durable (`output_dir` holds it).
///
/// Once the device is released, `on_device` is never dropped: freeing its tensors would call
/// into the destroyed CUDA context (the process exits right after this stage, and the OS
/// frees them).
pub fn finish<T>(
    output_dir: &Path,
    compute: &Compute,
    ending: Ending,
    on_device: T,
    write: impl FnOnce(&T, Option<&mut Option<Released>>) -> StageResult<Vec<WrittenFile>>,
    sink: &mut EventSink,
) -> StageResult<()> {
    let Ending {
        complete,
        step,
        total_steps,
        after_first,
        finished,
        mut metrics,
        mut milestones,
    } = ending;
    let checkpoint_started = Instant::now();
    let mut released: Option<Released> = None;
    let release = releases_early(complete, compute);
    let written = write(&on_device, release.then_some(&mut released));
    let pinned = crate::checkpoint::stream::pinned_buffers();
    if let Some(released) = &released {
        milestones.released(released);
        std::mem::forget(on_device);
    } else {
        drop(on_device);
    }
    let files = written?;
    let phases: Vec<(String, f64)> = files.iter().flat_map(|f| f.phases.clone()).collect();
    sink.checkpoint_files(files, Some(step));
    if !complete {
        return Err(Failure::interrupted(format!(
            "stopped by a signal after step {step} of {total_steps}; a resumable checkpoint is in {}",
            output_dir.display()
        )));
    }
    milestones.mark("t_checkpoint_durable");
    metrics.insert(
        "checkpoint_write_s".into(),
        checkpoint_started.elapsed().as_secs_f64(),
    );
    if let Some(t) = after_first {
        milestones.at("t_first_step", t);
    }
    milestones.at("t_last_step", finished);
    metrics.extend(milestones.into_metrics());
    metrics.extend(phases);
    if compute.device.is_cuda() {
        // For the boundary benchmark (the console's result line shows these too, so CPU stages,
        // where neither applies, leave them out). Every step is a fused AdamW (the worker's
        // kernels or libtorch's).
        metrics.insert("fused_adamw".into(), 1.0);
        metrics.insert("pinned_buffers".into(), pinned as f64);
    }
    crate::log!("metrics {metrics:?}");
    sink.metrics(&metrics);
    Ok(())
}
