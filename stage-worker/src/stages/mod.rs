//! One stage, start to finish: read the spec, run the task it names; and the commands that run
//! the model as a stage does without being one (`stage-worker check-kernels`: [`check_kernels`]).

pub mod check_kernels;
pub mod eval;
pub mod llama;
pub mod profile;
pub mod progress;
pub mod train;

/// The file an eval stage leaves in its output directory (listed in its `manifest.json`).
pub const RESULTS_FILE: &str = "metrics.json";

use crate::boot::spec::read_spec;
use crate::events::EventSink;
use crate::failure::{Failure, StageResult};
use protocol::plan::BuiltinKind;
use std::path::Path;

/// Runs the stage described by the spec at `spec_path`, sending `started`, `progress`,
/// `checkpoint` and `metrics` events on `sink`. The caller sends `done` or `failed`.
pub fn run(spec_path: &Path, sink: &mut EventSink) -> StageResult<()> {
    let spec = read_spec(spec_path)?;
    if let (Some(BuiltinKind::Train), Some(init)) = (spec.kind, llama::hf_init(&spec)) {
        return llama::train::run(&spec, &init, sink);
    }
    match spec.kind {
        Some(BuiltinKind::Train) => train::run(&spec, sink),
        Some(BuiltinKind::Eval) => eval::run(&spec, sink),
        None => Err(Failure::bad_input(format!(
            "the stage spec {} has no `kind`: stage-worker runs built-in `train` and `eval` stages only",
            spec_path.display()
        ))),
    }
}
