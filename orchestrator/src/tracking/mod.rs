//! Experiment tracking with no change to the stages: with `[run] tracking = "mlflow"`, a run
//! is logged to an MLflow server as one MLflow run, with a nested run per stage that started
//! (its params, its metrics at their steps, and what orchestrate verified as tags — see
//! [`record`]). The run directory is the source: what is logged is what `report.json` and the
//! stages' `events.jsonl` hold when the run ends, so `orchestrate track DIR` can log a run
//! again later (to a server that was down, or another one).
//!
//! Promises: tracking never changes a run's outcome or exit status; a server that cannot be
//! reached costs at most a few seconds (every call has a deadline) and one warning naming it.

pub mod mlflow;
pub mod record;

use crate::plan::LoadedPlan;
use mlflow::{Client, RunEnd};
use protocol::plan::{RunSettings, Tracking};
use protocol::report::{Report, RunStatus, StageStatus};
use std::path::Path;

/// Where a run is logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The server, `http://host:port`.
    pub uri: String,
    /// The experiment's name.
    pub experiment: String,
}

/// The tracking target of a run with `settings`: `None` without `tracking`; the URI from
/// `tracking_uri`, else `$MLFLOW_TRACKING_URI`; the experiment from `experiment`, else
/// `$MLFLOW_EXPERIMENT_NAME`, else the plan's `name`, else "orchestrate". An error says what
/// is missing.
pub fn target(settings: &RunSettings) -> Result<Option<Target>, String> {
    let Some(Tracking::Mlflow) = settings.tracking else {
        return Ok(None);
    };
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let uri = settings
        .tracking_uri
        .clone()
        .or_else(|| env("MLFLOW_TRACKING_URI"))
        .ok_or_else(|| {
            "tracking = \"mlflow\" needs the server: tracking_uri in [run], or MLFLOW_TRACKING_URI"
                .to_string()
        })?;
    let experiment = settings
        .experiment
        .clone()
        .or_else(|| env("MLFLOW_EXPERIMENT_NAME"))
        .or_else(|| settings.name.clone())
        .unwrap_or_else(|| "orchestrate".to_string());
    Ok(Some(Target { uri, experiment }))
}

/// What was logged.
#[derive(Debug, Clone)]
pub struct Logged {
    /// The MLflow run of the pipeline run.
    pub run_id: String,
    /// Its experiment's id.
    pub experiment_id: String,
    /// Nested runs made, one per stage that started.
    pub stages: usize,
}

/// Every stage's params ([`record::params`]), by stage index: what [`export`] logs.
pub fn stage_params(plan: &LoadedPlan) -> Vec<Vec<(String, String)>> {
    plan.plan
        .stages
        .iter()
        .enumerate()
        .map(|(i, stage)| record::params(stage, plan.instances.get(i).and_then(Option::as_ref)))
        .collect()
}

/// Logs the run in `run_dir` (its `report`, and `params` by stage index) to `target` as an
/// MLflow run named after the run directory. Blocking: a caller on an async runtime calls it
/// from a blocking thread.
pub fn export(
    target: &Target,
    report: &Report,
    params: &[Vec<(String, String)>],
    run_dir: &Path,
) -> Result<Logged, String> {
    let run_name = run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "run".into());
    let client = Client::new(&target.uri)?;
    let experiment_id = client.experiment(&target.experiment)?;
    let now = crate::timefmt::unix_ms() as i64;
    let start = now - (report.wall_s * 1000.0) as i64;
    let run_id = client.create_run(&experiment_id, &run_name, start, None)?;
    let run_tags = vec![
        ("orchestrate.run_dir".to_string(), report.run_dir.clone()),
        (
            "orchestrate.status".to_string(),
            report.status.as_str().to_string(),
        ),
        (
            "orchestrate.gpu_check".to_string(),
            report.gpu_check.clone(),
        ),
    ];
    let wall = mlflow::Metric {
        key: "wall_s".into(),
        value: report.wall_s,
        timestamp: now,
        step: 0,
    };
    client.log(&run_id, &[], &[wall], &run_tags)?;
    let mut stages = 0;
    for (i, stage) in report.stages.iter().enumerate() {
        if stage.attempts == 0 {
            continue;
        }
        let stage_params = params.get(i).map(Vec::as_slice).unwrap_or_default();
        let nested = Nested {
            client: &client,
            experiment: &experiment_id,
            parent: &run_id,
            now,
        };
        nested.export(stage, stage_params, run_dir)?;
        stages += 1;
    }
    client.end_run(&run_id, run_end(report.status), now)?;
    Ok(Logged {
        run_id,
        experiment_id,
        stages,
    })
}

/// Where a stage's run goes: nested under `parent` in `experiment`.
struct Nested<'a> {
    client: &'a Client,
    experiment: &'a str,
    parent: &'a str,
    /// When the export began (Unix ms): the time of what has no time of its own.
    now: i64,
}

impl Nested<'_> {
    /// Logs `stage` with `params`, its metrics from its `events.jsonl` in `run_dir`, and its
    /// tags, spanning its last attempt's spawn to its verdict.
    fn export(
        &self,
        stage: &protocol::report::StageReport,
        params: &[(String, String)],
        run_dir: &Path,
    ) -> Result<(), String> {
        let timing = stage.timing.as_ref();
        let start = timing.map_or(self.now, |t| (t.spawned * 1000.0) as i64);
        let end = timing.map_or(self.now, |t| (t.verified.max(t.exited) * 1000.0) as i64);
        let id = self
            .client
            .create_run(self.experiment, &stage.name, start, Some(self.parent))?;
        let events_path = run_dir
            .join("stages")
            .join(&stage.name)
            .join("events.jsonl");
        let events = std::fs::read_to_string(events_path).unwrap_or_default();
        let metrics = record::metrics(&events, stage, end);
        self.client
            .log(&id, params, &metrics, &record::tags(stage))?;
        let status = match stage.status {
            StageStatus::Succeeded => RunEnd::Finished,
            StageStatus::Cancelled | StageStatus::Skipped => RunEnd::Killed,
            _ => RunEnd::Failed,
        };
        self.client.end_run(&id, status, end)
    }
}

fn run_end(status: RunStatus) -> RunEnd {
    match status {
        RunStatus::Succeeded => RunEnd::Finished,
        RunStatus::Interrupted | RunStatus::Requeued => RunEnd::Killed,
        _ => RunEnd::Failed,
    }
}
