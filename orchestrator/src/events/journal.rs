//! The journal as a sink: the one place the run's events become journal records.

use super::{RunEvent, Sink};
use crate::store::journal::{Journal, JournalRecord};
use protocol::status::StageStatus;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

/// The run's open journal, shared by its sink and the run loop (which flushes the stage starts
/// that wait in it, and lends it to the records that are no run event: Slurm's).
#[derive(Debug, Clone)]
pub struct SharedJournal(Arc<Mutex<Journal>>);

impl SharedJournal {
    /// Shares `journal`.
    pub fn new(journal: Journal) -> SharedJournal {
        SharedJournal(Arc::new(Mutex::new(journal)))
    }

    fn lock(&self) -> MutexGuard<'_, Journal> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the journal (never across an `await`: nothing else may write meanwhile).
    pub fn with<R>(&self, f: impl FnOnce(&mut Journal) -> R) -> R {
        f(&mut self.lock())
    }

    /// Whether a stage's start waits to be written (see [`Journal::flush_pending`]).
    pub(crate) fn has_pending(&self) -> bool {
        self.lock().has_pending()
    }

    /// Writes the stage starts that wait.
    pub(crate) fn flush_pending(&self) -> io::Result<()> {
        self.lock().flush_pending()
    }
}

/// Appends each event's record (see [`record_of`]) to the journal.
#[derive(Debug)]
pub struct JournalSink(SharedJournal);

impl JournalSink {
    /// A sink writing to `journal`.
    pub fn new(journal: SharedJournal) -> JournalSink {
        JournalSink(journal)
    }
}

impl Sink for JournalSink {
    fn accept(&self, event: &RunEvent) -> io::Result<()> {
        match record_of(event) {
            Some(record) => self.0.lock().append(&record),
            None => Ok(()),
        }
    }
}

/// The journal's record of an event, if it has one: the run's start and verdict, a stage's
/// start, end and skip. A stage's end keeps what `resume` needs of it: its outputs only when
/// it succeeded; its metrics and wall time when it ran at all.
pub fn record_of(event: &RunEvent) -> Option<JournalRecord> {
    Some(match event {
        RunEvent::RunStarted {
            plan,
            pid,
            gpu_check,
            resumed,
        } => JournalRecord::RunStarted {
            plan: plan.clone(),
            pid: *pid,
            gpu_check: gpu_check.clone(),
            resumed: *resumed,
        },
        RunEvent::StageStarted {
            stage,
            attempt,
            pid,
            gpus,
            plan_hash,
            ..
        } => JournalRecord::StageStarted {
            stage: stage.clone(),
            attempt: *attempt,
            pid: *pid as u32,
            gpus: gpus.clone(),
            plan_hash: plan_hash.clone(),
        },
        RunEvent::StageFinished(end) => JournalRecord::StageFinished {
            stage: end.stage.clone(),
            attempt: end.attempt,
            status: end.status,
            error: end.error.clone(),
            checkpoints: match end.status {
                StageStatus::Succeeded => end.checkpoints.clone(),
                _ => Vec::new(),
            },
            plan_hash: end.plan_hash.clone(),
            metrics: end.metrics.clone(),
            wall_s: end.wall.map(|w| w.as_secs_f64()),
        },
        RunEvent::StageSkipped { stage, reason, .. } => JournalRecord::StageSkipped {
            stage: stage.clone(),
            reason: reason.clone(),
        },
        RunEvent::RunVerdict { status, exit_code } => JournalRecord::RunFinished {
            status: *status,
            exit_code: *exit_code,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::StageEnd;
    use std::time::Duration;

    #[test]
    fn a_failed_end_keeps_no_outputs_and_a_skip_is_one_record() {
        let end = StageEnd {
            stage: "train".into(),
            attempt: 2,
            status: StageStatus::Failed,
            error: Some("exit 1".into()),
            failure: Some(protocol::status::FailureClass::ExitCode),
            runs_again: false,
            lost_on: None,
            retry_in: None,
            wall: Some(Duration::from_secs(3)),
            plan_hash: "h".into(),
            checkpoints: vec![serde_json::from_str(
                r#"{"path": "model.safetensors", "bytes": 1, "blake3": "00"}"#,
            )
            .unwrap()],
            metrics: Default::default(),
            stderr_tail: None,
            facts: None,
        };
        let record = record_of(&RunEvent::StageFinished(Box::new(end))).unwrap();
        let JournalRecord::StageFinished {
            checkpoints,
            wall_s,
            ..
        } = record
        else {
            panic!("{record:?}")
        };
        assert!(checkpoints.is_empty());
        assert_eq!(wall_s, Some(3.0));
        let skip = RunEvent::StageSkipped {
            stage: "eval".into(),
            class: protocol::status::FailureClass::UpstreamFailed,
            reason: "upstream stage `train` did not succeed".into(),
        };
        assert!(matches!(
            record_of(&skip),
            Some(JournalRecord::StageSkipped { .. })
        ));
        assert!(record_of(&RunEvent::Note("n".into())).is_none());
    }
}
