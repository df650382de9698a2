//! `orchestrate status`: what a resume of a run directory would keep and run again, and why.

use super::{load_or_report, print_json, run_dir_error};
use orchestrator::exit;
use orchestrator::plan::LoadedPlan;
use orchestrator::run::resume::Decision;
use orchestrator::store::journal::OpenAttempt;
use orchestrator::store::rundir::LockOwner;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// A run directory as `status` shows it: the plan to compare with, what a resume would do
/// with each stage, and, while the run is live, its owner and the attempts running now.
struct RunStatus {
    root: PathBuf,
    loaded: LoadedPlan,
    decisions: Vec<Decision>,
    owner: Option<LockOwner>,
    running: Vec<OpenAttempt>,
}

impl RunStatus {
    /// The attempt of `stage` running now, if any.
    fn running_of(&self, stage: &str) -> Option<&OpenAttempt> {
        self.running.iter().find(|a| a.stage == stage)
    }
}

/// `orchestrate status DIR [--plan PLAN] [--json]`.
pub(crate) fn status(run_dir: &Path, plan: Option<&Path>, json: bool) -> ExitCode {
    let status = match read_status(run_dir, plan) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if json {
        print_status_json(&status);
    } else {
        print_status_text(&status);
    }
    ExitCode::SUCCESS
}

fn read_status(run_dir: &Path, plan: Option<&Path>) -> Result<RunStatus, ExitCode> {
    let root = orchestrator::store::rundir::existing_run(run_dir).map_err(|e| run_dir_error(&e))?;
    let loaded = match plan {
        Some(p) => load_or_report(p)?,
        None => super::run::load_run_plan(&root)?.loaded,
    };
    let records = orchestrator::store::journal::read_run_journal(&root).map_err(|e| {
        eprintln!("error: cannot read the journal: {e}");
        ExitCode::from(exit::RUN_ERROR as u8)
    })?;
    let owner = orchestrator::store::rundir::live_owner(&root);
    // While the run is live, a stage started and not finished is running, not interrupted.
    let running = match owner {
        Some(_) => orchestrator::store::journal::open_attempts(
            &root.join(orchestrator::store::rundir::JOURNAL_FILE),
        )
        .unwrap_or_default(),
        None => Vec::new(),
    };
    let prints = orchestrator::plan::fingerprint::stage_fingerprints(&loaded);
    let decisions = orchestrator::run::resume::decide(&loaded, &prints, &records);
    Ok(RunStatus {
        root,
        loaded,
        decisions,
        owner,
        running,
    })
}

fn print_status_json(status: &RunStatus) {
    let rows: Vec<serde_json::Value> = status
        .loaded
        .plan
        .stages
        .iter()
        .zip(&status.decisions)
        .map(|(s, d)| match status.running_of(&s.name) {
            Some(a) => serde_json::json!({"stage": s.name, "resume": d, "running": {
                "attempt": a.attempt, "pid": a.pid, "since_unix_ms": a.since_ms}}),
            None => serde_json::json!({"stage": s.name, "resume": d}),
        })
        .collect();
    let out = serde_json::json!({
        "run_dir": status.root.display().to_string(),
        "live": status.owner.as_ref().map(|o| serde_json::json!({"pid": o.pid, "host": o.host})),
        "stages": rows,
    });
    print_json(&out);
}

fn print_status_text(status: &RunStatus) {
    let loaded = &status.loaded;
    if let Some(owner) = &status.owner {
        println!(
            "{} is running now ({owner}); stages not running now show what a resume would do:",
            status.root.display()
        );
    }
    let now_ms = orchestrator::timefmt::unix_ms();
    let text = orchestrator::run::resume::render(loaded, &status.decisions);
    let names = loaded.plan.stages.iter().map(|s| s.name.as_str());
    let width = orchestrator::table::column_width("stage", names);
    for (line, stage) in text.lines().zip(&loaded.plan.stages) {
        match status.running_of(&stage.name) {
            Some(a) => {
                println!(
                    "{:<width$}  running (attempt {}, pid {}, since {}, {:.0} s ago)",
                    stage.name,
                    a.attempt,
                    a.pid,
                    orchestrator::timefmt::rfc3339_ms(a.since_ms),
                    now_ms.saturating_sub(a.since_ms) as f64 / 1e3
                );
            }
            None => println!("{line}"),
        }
    }
}
