//! The run directory's files that no stage waits for, written on a thread of their own while
//! the first stages run: `plan.resolved.json` (the plan as run) and the first `report.json`
//! (every stage pending). For a sweep of 100,000 stages they are tens of megabytes of JSON,
//! which the first stage no longer waits for.
//!
//! Promises: [`RunFiles::finish`] returns once both are written (or failed), and the run loop
//! calls it before it writes `report.json` itself, so the two never write it at once; a
//! `plan.resolved.json` that cannot be written fails the run there, as it did when it was
//! written before the first stage; a first report that cannot be written is a warning.

use crate::error::Context;
use crate::plan::LoadedPlan;
use crate::report::Snapshot;
use crate::store::rundir::RunDir;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// What the thread reports.
struct Outcome {
    /// The plan copy's failure (fatal).
    written: crate::error::Result<()>,
    /// The report's (a warning).
    warning: Option<String>,
}

/// The thread writing them, until [`RunFiles::finish`].
pub(crate) struct RunFiles(Option<JoinHandle<Outcome>>);

impl RunFiles {
    /// Starts writing `plan`'s files in `run_dir`, the report with every stage pending
    /// (`gpu_check` and `started` as the run's reports give them).
    /// Without `first_report` (the run's placement, for the report), only the plan (a resumed
    /// run's first report, with the stages it keeps, is the run loop's to write).
    pub(crate) fn start(
        plan: Arc<LoadedPlan>,
        run_dir: RunDir,
        gpu_check: String,
        started: Instant,
        first_report: Option<super::placement::Placement>,
    ) -> std::io::Result<RunFiles> {
        let thread = std::thread::Builder::new()
            .name("run-files".into())
            .spawn(move || {
                crate::process::background::yield_to_the_run();
                let resolved = run_dir.root().join("plan.resolved.json");
                let written = crate::store::rundir::write_json_replace(&resolved, &plan.as_run())
                    .with_context(|| format!("cannot write {}", resolved.display()));
                let Some(placement) = first_report else {
                    return Outcome {
                        written,
                        warning: None,
                    };
                };
                let report = run_dir.report_path();
                let snapshot =
                    Snapshot::all_pending(&plan, &run_dir, &gpu_check, started, &placement);
                let warning = crate::store::rundir::write_json_replace(&report, &snapshot)
                    .err()
                    .map(|e| format!("cannot write {}: {e}", report.display()));
                Outcome { written, warning }
            })?;
        Ok(RunFiles(Some(thread)))
    }

    /// Whether the files are written (or failed): [`RunFiles::finish`] would not wait. The
    /// thread runs at a lower CPU priority (`crate::process::background`), so on a busy
    /// machine it may take a while; a report rewrite during the run waits for it only here.
    pub(crate) fn done(&self) -> bool {
        self.0.as_ref().is_none_or(|thread| thread.is_finished())
    }

    /// Waits until the files are written. Returns the plan copy's failure, and tells
    /// `console` of the report's; `Ok` once they were waited for.
    pub(crate) fn finish(&mut self, console: &crate::events::Events) -> crate::error::Result<()> {
        let Some(thread) = self.0.take() else {
            return Ok(());
        };
        let Outcome { written, warning } = thread.join().unwrap_or_else(|_| {
            let stopped =
                crate::error::Error::Internal("the thread writing the run's files stopped".into());
            Outcome {
                written: Err(stopped),
                warning: None,
            }
        });
        if let Some(warning) = warning {
            console.warn(&warning);
        }
        written
    }
}

impl Drop for RunFiles {
    /// A run that ends early (an error) still waits for the thread: nothing writes into its
    /// directory after the run returned.
    fn drop(&mut self) {
        if let Some(thread) = self.0.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::parse_plan_toml;
    use std::path::Path;

    fn plan(n: usize) -> Arc<LoadedPlan> {
        let text: String = (0..n)
            .map(|i| format!("[[stage]]\nname = \"s{i}\"\ncommand = [\"true\"]\n"))
            .collect();
        Arc::new(parse_plan_toml(&text, "t.toml", Path::new("/")).unwrap())
    }

    #[test]
    fn the_plan_copy_and_a_first_report_with_every_stage_pending_are_written() {
        let dir = crate::testutil::scratch("run-files");
        let run_dir = RunDir::create(&dir.join("run")).unwrap();
        let console = crate::events::Events::new();
        let settings = crate::settings::Settings::default();
        let local = super::super::placement::Placement::new(None, run_dir.root(), &settings);
        let mut files = RunFiles::start(
            plan(3),
            run_dir.clone(),
            "off".into(),
            Instant::now(),
            Some(local),
        )
        .unwrap();
        files.finish(&console).unwrap();
        let resolved: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(run_dir.root().join("plan.resolved.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(resolved["stage"].as_array().unwrap().len(), 3);
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run_dir.report_path()).unwrap()).unwrap();
        let stages = report["stages"].as_array().unwrap();
        assert_eq!(stages.len(), 3);
        assert!(stages.iter().all(|s| s["status"] == "pending"), "{report}");
        // Waited for once: a second wait returns at once.
        files.finish(&console).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_plan_copy_that_cannot_be_written_fails_and_no_report_is_written_without_asking() {
        let dir = crate::testutil::scratch("run-files-fail");
        let run_dir = RunDir::create(&dir.join("run")).unwrap();
        // A directory where the file goes: the rename over it fails.
        std::fs::create_dir(run_dir.root().join("plan.resolved.json")).unwrap();
        std::fs::write(run_dir.root().join("plan.resolved.json/x"), "x").unwrap();
        let console = crate::events::Events::new();
        let mut files =
            RunFiles::start(plan(2), run_dir.clone(), "off".into(), Instant::now(), None).unwrap();
        let err = files.finish(&console).unwrap_err().to_string();
        assert!(err.contains("plan.resolved.json"), "{err}");
        assert!(!run_dir.report_path().exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
