//! Deciding, from a run's journal and the (possibly edited) plan, which stages a resumed run
//! keeps and which it runs again, and why.
//!
//! A stage is kept when its last attempt in the journal succeeded, its fingerprint is the one
//! the plan gives it now, every output recorded for it still verifies (size and checksum), and
//! every upstream stage is kept. Otherwise it runs again, with the reason said.

use crate::plan::LoadedPlan;
use crate::store::checksum::{check_file_until, Depth, FileMismatch};
use crate::store::journal::JournalRecord;
use protocol::checkpoint::Checksum;
use protocol::report::CheckpointRecord;
use std::path::Path;
use std::sync::atomic::AtomicBool;

pub use protocol::resume::Decision;

/// Why a recorded output no longer verifies: the reason a resumed run runs its stage again.
#[derive(Debug, thiserror::Error)]
pub enum OutputChanged {
    /// The file cannot be found (or its metadata read).
    #[error("its output {path} is missing")]
    Missing {
        /// The file, as recorded.
        path: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The file has another size than recorded.
    #[error("its output {path} changed size ({actual} bytes, {recorded} recorded)")]
    Size {
        /// The file, as recorded.
        path: String,
        /// Its size now, in bytes.
        actual: u64,
        /// Its recorded size, in bytes.
        recorded: u64,
    },
    /// The file could not be read to hash it.
    #[error("its output {path} cannot be read: {source}")]
    Unreadable {
        /// The file, as recorded.
        path: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The file's bytes hash to another checksum than recorded.
    #[error("its output {path} is corrupted (checksum differs)")]
    Corrupted {
        /// The file, as recorded.
        path: String,
        /// Its checksum now (under the recorded one's algorithm).
        actual: Checksum,
        /// Its recorded checksum.
        recorded: Checksum,
    },
}

/// Checks a recorded output against the file now.
pub fn verify_record(record: &CheckpointRecord) -> Result<(), OutputChanged> {
    verify_record_until(record, &AtomicBool::new(false))
}

/// [`verify_record`], given up (as [`OutputChanged::Unreadable`], "verification interrupted")
/// within a mebibyte once `abort` is raised.
pub(crate) fn verify_record_until(
    record: &CheckpointRecord,
    abort: &AtomicBool,
) -> Result<(), OutputChanged> {
    let depth = Depth::Content;
    check_file_until(
        Path::new(&record.path),
        record.bytes,
        &record.checksum,
        depth,
        abort,
    )
    .map_err(|m| {
        let path = record.path.clone();
        match m {
            FileMismatch::Missing(source) => OutputChanged::Missing { path, source },
            FileMismatch::Size { actual } => OutputChanged::Size {
                path,
                actual,
                recorded: record.bytes,
            },
            FileMismatch::Unreadable(source) => OutputChanged::Unreadable { path, source },
            FileMismatch::Checksum { actual } => OutputChanged::Corrupted {
                path,
                actual,
                recorded: record.checksum.clone(),
            },
        }
    })
}

/// One decision per stage, in plan order.
pub fn decide(
    plan: &LoadedPlan,
    fingerprints: &[String],
    records: &[JournalRecord],
) -> Vec<Decision> {
    decide_until(plan, fingerprints, records, &AtomicBool::new(false))
}

/// [`decide`], whose re-hashing of kept outputs gives up once `abort` is raised (a stage whose
/// check was given up is then run again: the caller is stopping anyway).
pub(crate) fn decide_until(
    plan: &LoadedPlan,
    fingerprints: &[String],
    records: &[JournalRecord],
    abort: &AtomicBool,
) -> Vec<Decision> {
    let n = plan.plan.stages.len();
    let mut attempts = vec![0u32; n];
    let mut last_success: Vec<Option<&JournalRecord>> = vec![None; n];
    for record in records {
        match record {
            JournalRecord::StageStarted { stage, .. } => {
                if let Some(i) = plan.index_of(stage) {
                    attempts[i] += 1;
                    last_success[i] = None; // a later attempt supersedes an earlier success
                }
            }
            JournalRecord::StageFinished { stage, status, .. }
                if *status == protocol::status::StageStatus::Succeeded =>
            {
                if let Some(i) = plan.index_of(stage) {
                    last_success[i] = Some(record);
                }
            }
            _ => {}
        }
    }
    let mut decisions: Vec<Option<Decision>> = vec![None; n];
    for &i in &plan.order {
        let attempts = attempts[i];
        let rerun_upstream = plan.upstream[i]
            .iter()
            .find(|&&u| !decisions[u].as_ref().is_some_and(Decision::kept));
        let decision = if let Some(&u) = rerun_upstream {
            Decision::Run {
                reason: format!("upstream stage `{}` runs again", plan.plan.stages[u].name),
                attempts,
                clear_output: last_success[i].is_some(),
            }
        } else {
            match last_success[i] {
                None if attempts == 0 => Decision::Run {
                    reason: "it has not run yet".into(),
                    attempts,
                    clear_output: false,
                },
                None => Decision::Run {
                    reason: "it did not finish in the earlier run (interrupted or failed)".into(),
                    attempts,
                    clear_output: false,
                },
                Some(JournalRecord::StageFinished {
                    checkpoints,
                    plan_hash,
                    metrics,
                    wall_s,
                    ..
                }) => {
                    if *plan_hash != fingerprints[i] {
                        Decision::Run {
                            reason: "its definition in the plan changed since it ran".into(),
                            attempts,
                            clear_output: true,
                        }
                    } else if let Some(why) = checkpoints
                        .iter()
                        .find_map(|c| verify_record_until(c, abort).err())
                    {
                        Decision::Run {
                            reason: why.to_string(),
                            attempts,
                            clear_output: true,
                        }
                    } else {
                        Decision::Keep {
                            attempts,
                            checkpoints: checkpoints.clone(),
                            metrics: metrics.clone(),
                            wall_s: *wall_s,
                        }
                    }
                }
                Some(_) => unreachable!("only stage_finished records are kept as successes"),
            }
        };
        decisions[i] = Some(decision);
    }
    decisions
        .into_iter()
        .map(|d| d.expect("every stage is in the order"))
        .collect()
}

/// A table of the decisions, for `orchestrate status` and the start of a resumed run.
pub fn render(plan: &LoadedPlan, decisions: &[Decision]) -> String {
    let names = plan.plan.stages.iter().map(|s| s.name.as_str());
    let width = crate::table::column_width("stage", names);
    let mut out = String::new();
    for (stage, d) in plan.plan.stages.iter().zip(decisions) {
        let line = match d {
            Decision::Keep { attempts, .. } => {
                format!("keep   (finished after {attempts} attempt(s), outputs verified)")
            }
            Decision::Run { reason, .. } => format!("run    ({reason})"),
        };
        out.push_str(&format!("{:<width$}  {line}\n", stage.name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::parse_plan_toml;
    use protocol::status::StageStatus;
    use std::path::Path;

    fn plan() -> LoadedPlan {
        let text = "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n\
                    [[stage]]\nname = \"b\"\ncommand = [\"true\"]\nafter = [\"a\"]\n\
                    [[stage]]\nname = \"c\"\ncommand = [\"true\"]\n";
        parse_plan_toml(text, "t.toml", Path::new("/")).unwrap()
    }

    fn started(stage: &str) -> JournalRecord {
        JournalRecord::StageStarted {
            stage: stage.into(),
            attempt: 1,
            pid: 1,
            gpus: Vec::new(),
            plan_hash: "h".into(),
        }
    }

    fn finished(stage: &str, status: StageStatus, plan_hash: &str) -> JournalRecord {
        JournalRecord::StageFinished {
            stage: stage.into(),
            attempt: 1,
            status,
            error: None,
            checkpoints: Vec::new(),
            plan_hash: plan_hash.into(),
            metrics: Default::default(),
            wall_s: Some(1.0),
        }
    }

    fn reason(d: &Decision) -> &str {
        match d {
            Decision::Run { reason, .. } => reason,
            Decision::Keep { .. } => "keep",
        }
    }

    #[test]
    fn a_finished_stage_is_kept_and_one_that_never_ran_or_did_not_finish_runs() {
        let p = plan();
        let records = [
            started("a"),
            finished("a", StageStatus::Succeeded, "h"),
            started("b"),
        ];
        let d = decide(&p, &["h".into(), "h".into(), "h".into()], &records);
        assert!(d[0].kept());
        assert_eq!(
            reason(&d[1]),
            "it did not finish in the earlier run (interrupted or failed)"
        );
        assert_eq!(reason(&d[2]), "it has not run yet");
    }

    #[test]
    fn a_changed_stage_runs_again_with_everything_downstream_and_its_old_output_cleared() {
        let p = plan();
        let records = [
            started("a"),
            finished("a", StageStatus::Succeeded, "old"),
            started("b"),
            finished("b", StageStatus::Succeeded, "h"),
        ];
        let d = decide(&p, &["new".into(), "h".into(), "h".into()], &records);
        assert_eq!(
            reason(&d[0]),
            "its definition in the plan changed since it ran"
        );
        assert!(matches!(
            d[0],
            Decision::Run {
                clear_output: true,
                attempts: 1,
                ..
            }
        ));
        assert_eq!(reason(&d[1]), "upstream stage `a` runs again");
        assert!(matches!(
            d[1],
            Decision::Run {
                clear_output: true,
                ..
            }
        ));
    }

    #[test]
    fn a_later_attempt_supersedes_an_earlier_success() {
        let p = plan();
        let records = [
            started("a"),
            finished("a", StageStatus::Succeeded, "h"),
            started("a"),
            finished("a", StageStatus::Failed, "h"),
        ];
        let d = decide(&p, &["h".into(), "h".into(), "h".into()], &records);
        assert!(!d[0].kept());
        assert!(matches!(d[0], Decision::Run { attempts: 2, .. }));
    }
}
