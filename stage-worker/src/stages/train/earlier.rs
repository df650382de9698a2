//! What an earlier attempt of this training left in the output directory: a checkpoint to
//! resume from, a completed training to report again, or another run's checkpoint to forget.

use crate::checkpoint::{self, Verified};
use crate::events::EventSink;
use crate::failure::{Failure, StageResult};
use protocol::worker::{ModelConfig, TrainParams};
use std::collections::BTreeMap;
use std::path::Path;

/// The training state a checkpoint of this training records.
pub fn training_state(p: &TrainParams, complete: bool) -> checkpoint::TrainingState {
    checkpoint::TrainingState {
        complete,
        total_steps: p.steps,
        data: p.data.clone(),
        seed: p.seed,
    }
}

/// This stage's own interrupted checkpoint in `dir`, if it holds one from the same training
/// (same steps, data, seed and shape) that verifies; anything else is left to be overwritten.
pub fn resumable(dir: &Path, p: &TrainParams, config: &ModelConfig) -> Option<Verified> {
    if !checkpoint::exists(dir) {
        return None;
    }
    let v = match checkpoint::open_verified(dir) {
        Ok(v) => v,
        Err(e) => {
            crate::log!("not resuming from {}: {e}", dir.display());
            return None;
        }
    };
    let same = v.training() == Some(training_state(p, false))
        && v.model_config().ok().as_ref() == Some(config)
        && v.manifest.step.is_some_and(|s| s < p.steps);
    same.then_some(v)
}

/// File, beside the checkpoint, holding the final metrics of a completed training: a stage
/// killed after its final checkpoint was durable reports them again instead of retraining.
const FINAL_METRICS_FILE: &str = "final_metrics.json";

/// This stage's own *completed* checkpoint in `dir` (same training, all steps done, every file
/// verified), if any: the previous attempt finished its work but was stopped before it could
/// report (a kill between the final checkpoint and the process's exit).
pub fn completed(dir: &Path, p: &TrainParams, config: &ModelConfig) -> Option<Verified> {
    if !checkpoint::exists(dir) || !dir.join(FINAL_METRICS_FILE).is_file() {
        return None;
    }
    let v = checkpoint::open_verified(dir).ok()?;
    let same = v.training() == Some(training_state(p, true))
        && v.model_config().ok().as_ref() == Some(config)
        && v.manifest.step == Some(p.steps);
    same.then_some(v)
}

/// Reports the completed checkpoint `v` (its files and final metrics) as this attempt's result.
pub fn report_completed(v: &Verified, sink: &mut EventSink) -> StageResult<()> {
    let metrics_path = v.dir.join(FINAL_METRICS_FILE);
    let metrics: BTreeMap<String, f64> = std::fs::read(&metrics_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| Failure::other(format!("cannot read {}", metrics_path.display())))?;
    let step = v.manifest.step.unwrap_or(0);
    for f in &v.manifest.files {
        let path = v.dir.join(&f.path);
        let identity = std::fs::metadata(&path)
            .ok()
            .map(|m| checkpoint::identity_of(&m));
        sink.checkpoint(path, f.checksum.clone(), f.bytes, Some(step), identity);
    }
    let manifest = v.dir.join(protocol::checkpoint::MANIFEST_FILE);
    let bytes = std::fs::read(&manifest)
        .map_err(|e| Failure::other(format!("cannot read {}: {e}", manifest.display())))?;
    let identity = std::fs::metadata(&manifest)
        .ok()
        .map(|m| checkpoint::identity_of(&m));
    sink.checkpoint(
        manifest,
        crate::checkpoint::fsio::checksum(&bytes),
        bytes.len() as u64,
        Some(step),
        identity,
    );
    crate::log!(
        "the final checkpoint of this training is already complete in {} (step {step}); kept, not retrained",
        v.dir.display()
    );
    sink.metrics(&metrics);
    Ok(())
}

/// Removes the manifest of an output directory's checkpoint that this run will not resume, so
/// that until this run writes its own, the directory cannot pass for this run's output.
pub fn forget_stale_checkpoint(dir: &Path) -> StageResult<()> {
    if checkpoint::exists(dir) {
        crate::log!(
            "{} holds a checkpoint of another run; it will be replaced",
            dir.display()
        );
        crate::checkpoint::fsio::remove_durably(dir, protocol::checkpoint::MANIFEST_FILE).map_err(
            |e| {
                Failure::other(format!(
                    "cannot remove the old manifest in {}: {e}",
                    dir.display()
                ))
            },
        )?;
    }
    Ok(())
}

/// Writes the final metrics of a completed training beside its checkpoint (before the
/// checkpoint's manifest: once the manifest says "complete", the metrics that go with it are
/// on disk too).
pub fn write_final_metrics(dir: &Path, metrics: &BTreeMap<String, f64>) -> StageResult<()> {
    let mut text = serde_json::to_vec_pretty(metrics).expect("metrics serialize");
    text.push(b'\n');
    std::fs::create_dir_all(dir)
        .and_then(|()| crate::checkpoint::fsio::write_atomic(dir, FINAL_METRICS_FILE, &text))
        .map_err(|e| {
            Failure::other(format!(
                "cannot write {}: {e}",
                dir.join(FINAL_METRICS_FILE).display()
            ))
        })
}
