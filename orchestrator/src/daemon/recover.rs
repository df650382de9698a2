//! A starting daemon's recovery of the runs under its `--runs-dir`.
//!
//! Promises:
//! - every directory there is either listed as a run or reported in the daemon's log with why
//!   it is not one (no `submission.json`, or one that does not parse); files are left alone;
//! - a run's id is its directory's name, which the file system keeps unique: a copied run
//!   directory is listed under its own name (with a warning when its `submission.json` names
//!   another), never as a second entry with the original's id;
//! - a finished run is listed as it ended: its state, exit status, the time its journal
//!   records for its end, and its succeeded stages counted from the journal;
//! - a run that did not finish (the daemon was killed under it) is resumed, and so is one the
//!   daemon's own shutdown stopped (`stopped-by-daemon` in its directory, written before the
//!   stop): a restart after SIGTERM or `shutdown --cancel` does what one after `kill -9` does.
//!   A run a user cancelled stays interrupted.

use super::registry::{RunEntry, Submission, STOPPED_FILE, SUBMISSION_FILE};
use super::Daemon;
use crate::store::journal::JournalRecord;
use protocol::status::{RunStatus, StageStatus};
use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// The largest `submission.json` read back (a real one is a few hundred bytes).
const MAX_SUBMISSION_BYTES: u64 = 1 << 20;

/// A run directory found under the runs directory.
struct Found {
    submission: Submission,
    dir: PathBuf,
}

/// How a run's journal says it stands.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ended {
    /// It ended with this status and exit code, at this time (Unix seconds, when recorded).
    Finished(RunStatus, i32, Option<f64>),
    /// It started (again) and has not ended, or never started.
    Open,
}

impl Daemon {
    /// Recovers the runs under the runs directory: finished ones as history, the others
    /// resumed (see the module's promises).
    pub fn recover(self: &Rc<Self>) {
        for found in scan(&self.config.runs_dir) {
            self.recover_one(found);
        }
    }

    fn recover_one(self: &Rc<Self>, found: Found) {
        let Found { submission, dir } = found;
        let id = submission.id.clone();
        let priority = submission.priority;
        let records = crate::store::journal::read_run_journal(&dir).unwrap_or_default();
        let stopped_file = dir.join(STOPPED_FILE);
        let stopped_by_daemon = stopped_file.exists();
        let mut entry = RunEntry::new(submission, dir.clone());
        entry.count_earlier_successes(succeeded_stages(&records));
        match ended(&dir, &records) {
            Ended::Finished(RunStatus::Interrupted, _, _) if stopped_by_daemon => {}
            Ended::Finished(status, code, at) => {
                let _ = std::fs::remove_file(&stopped_file);
                let at = at.unwrap_or(entry.submission.submitted_unix);
                entry.finish_at(status, code, at);
                self.registry.borrow_mut().insert(entry);
                return;
            }
            Ended::Open => {}
        }
        self.registry.borrow_mut().insert(entry);
        match self.resume_run(&dir) {
            Ok((plan, run_dir)) => {
                tracing::info!(run = %id, "resuming a run the daemon's end interrupted");
                // Resumed now: a later stop of it (a user's cancel) is its own.
                let _ = std::fs::remove_file(&stopped_file);
                self.spawn_run(id, plan, run_dir, true, priority);
            }
            Err(why) => {
                tracing::warn!(run = %id, "cannot resume: {why}");
                if let Some(e) = self.registry.borrow_mut().get_mut(&id) {
                    e.finish(RunStatus::Interrupted, crate::exit::INTERRUPTED);
                }
            }
        }
    }
}

/// The runs under `runs_dir`, oldest submission first; directories that are not runs are
/// reported in the log.
fn scan(runs_dir: &Path) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir(runs_dir) else {
        return Vec::new();
    };
    let mut found: Vec<Found> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let dir = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            match read_submission(&dir) {
                Ok(mut submission) => {
                    if submission.id != name {
                        tracing::warn!(
                            "{}: its {SUBMISSION_FILE} names run {:?} (a copied or renamed run directory?); it is listed as run {name:?}, its directory's name",
                            dir.display(),
                            submission.id
                        );
                        submission.id = name;
                    }
                    Some(Found { submission, dir })
                }
                Err(why) => {
                    tracing::warn!(
                        "{}: not a run of this daemon, left alone: {why}",
                        dir.display()
                    );
                    None
                }
            }
        })
        .collect();
    found.sort_by(|a, b| {
        a.submission
            .submitted_unix
            .total_cmp(&b.submission.submitted_unix)
            .then_with(|| a.submission.id.cmp(&b.submission.id))
    });
    found
}

/// A run directory's `submission.json`, or why it has none that parses.
fn read_submission(dir: &Path) -> Result<Submission, String> {
    let path = dir.join(SUBMISSION_FILE);
    let file = std::fs::File::open(&path).map_err(|e| format!("{SUBMISSION_FILE}: {e}"))?;
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err(format!("{SUBMISSION_FILE} is not a regular file"));
    }
    let mut text = String::new();
    file.take(MAX_SUBMISSION_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| format!("{SUBMISSION_FILE}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{SUBMISSION_FILE} does not parse: {e}"))
}

/// The stages whose latest attempt in the journal succeeded (and that did not start again
/// or get skipped since): what a resumed run keeps, at most.
pub fn succeeded_stages(records: &[JournalRecord]) -> HashSet<String> {
    let mut succeeded = HashSet::new();
    for record in records {
        match record {
            JournalRecord::StageStarted { stage, .. }
            | JournalRecord::StageSkipped { stage, .. } => {
                succeeded.remove(stage);
            }
            JournalRecord::StageFinished { stage, status, .. } => {
                if *status == StageStatus::Succeeded {
                    succeeded.insert(stage.clone());
                } else {
                    succeeded.remove(stage);
                }
            }
            _ => {}
        }
    }
    succeeded
}

/// Whether the journal's last start of the run has an end, and which.
fn ended(dir: &Path, records: &[JournalRecord]) -> Ended {
    records
        .iter()
        .rev()
        .find_map(|r| match r {
            JournalRecord::RunFinished { status, exit_code } => Some(Ended::Finished(
                *status,
                *exit_code,
                finished_time(&dir.join(crate::store::rundir::JOURNAL_FILE)),
            )),
            JournalRecord::RunStarted { .. } => Some(Ended::Open),
            _ => None,
        })
        .unwrap_or(Ended::Open)
}

/// When the journal's last `run_finished` record was written (Unix seconds).
fn finished_time(journal: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(journal).ok()?;
    text.lines().rev().find_map(|line| {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        if value["rec"] != "run_finished" {
            return None;
        }
        value["t"].as_u64().map(|ms| ms as f64 / 1000.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(stage: &str) -> JournalRecord {
        JournalRecord::StageStarted {
            stage: stage.into(),
            attempt: 1,
            pid: 1,
            gpus: vec![],
            plan_hash: String::new(),
        }
    }

    fn finished(stage: &str, status: StageStatus) -> JournalRecord {
        JournalRecord::StageFinished {
            stage: stage.into(),
            attempt: 1,
            status,
            error: None,
            checkpoints: vec![],
            plan_hash: String::new(),
            metrics: Default::default(),
            wall_s: None,
        }
    }

    #[test]
    fn a_stage_counts_as_succeeded_only_while_its_latest_attempt_is_a_success() {
        let records = vec![
            started("a"),
            finished("a", StageStatus::Succeeded),
            started("b"),
            finished("b", StageStatus::Succeeded),
            started("c"),
            finished("c", StageStatus::Failed),
            // A resume runs b again; it has not ended.
            started("b"),
            started("c"),
            finished("c", StageStatus::Succeeded),
        ];
        let got = succeeded_stages(&records);
        let mut got: Vec<&str> = got.iter().map(String::as_str).collect();
        got.sort();
        assert_eq!(got, ["a", "c"]);
    }

    #[test]
    fn a_directory_without_a_valid_submission_is_not_a_run_and_says_why() {
        let dir = crate::testutil::scratch("recover-submission");
        let missing = read_submission(&dir).unwrap_err();
        assert!(missing.contains("submission.json"), "{missing}");
        std::fs::write(dir.join(SUBMISSION_FILE), "{\"id\": 3}").unwrap();
        let bad = read_submission(&dir).unwrap_err();
        assert!(bad.contains("does not parse"), "{bad}");
    }
}
