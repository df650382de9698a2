//! `orchestrate track DIR`: logs a run directory to an experiment tracker, as a run whose plan
//! says `tracking = "mlflow"` is logged when it ends — for a run whose server was down, a run
//! made without tracking, or another server.

use super::run_dir_error;
use orchestrator::exit;
use orchestrator::tracking::{self, Target};
use protocol::plan::Tracking;
use std::path::Path;
use std::process::ExitCode;

/// Logs the run in `run_dir` to MLflow: the server `uri`, else the plan's `tracking_uri`, else
/// `$MLFLOW_TRACKING_URI`; the experiment likewise. Exit 0 logged, 2 nothing to log or no
/// server named, 4 the server refused or could not be reached.
pub(crate) fn track(run_dir: &Path, uri: Option<String>, experiment: Option<String>) -> ExitCode {
    let root = match orchestrator::store::rundir::existing_run(run_dir) {
        Ok(root) => root,
        Err(e) => return run_dir_error(&e),
    };
    let loaded = match super::run::load_run_plan(&root) {
        Ok(plan) => plan.loaded,
        Err(code) => return code,
    };
    let mut settings = loaded.plan.run.clone();
    settings.tracking = Some(Tracking::Mlflow);
    settings.tracking_uri = uri.or(settings.tracking_uri);
    settings.experiment = experiment.or(settings.experiment);
    let target: Target = match tracking::target(&settings) {
        Ok(Some(target)) => target,
        Ok(None) => unreachable!("tracking was just set"),
        Err(e) => {
            eprintln!("error: {e} (or --uri)");
            return ExitCode::from(exit::INVALID_INPUT as u8);
        }
    };
    let report = match orchestrator::report::load_for_display(&root) {
        Ok(report) => report,
        Err(e) => return run_dir_error(&e),
    };
    let params = tracking::stage_params(&loaded);
    match tracking::export(&target, &report, &params, &root) {
        Ok(logged) => {
            println!(
                "MLflow run {} ({} stages) in experiment {:?} (id {}) at {}",
                logged.run_id, logged.stages, target.experiment, logged.experiment_id, target.uri
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: not logged to {}: {e}", target.uri);
            ExitCode::from(exit::RUN_ERROR as u8)
        }
    }
}
