//! The daemon's per-run feed as a sink: each event as the wire's [`protocol::daemon::RunEvent`]s,
//! timestamped, on a channel the daemon's event log and its watchers read.

use super::{RunEvent, Sink};
use protocol::daemon::{RunEvent as WireEvent, RunEventKind};
use std::io;
use tokio::sync::mpsc::UnboundedSender;

/// Sends every event, as the wire has it, to a channel (a closed channel is no error: the
/// run goes on without readers).
#[derive(Debug)]
pub struct TapSink(UnboundedSender<WireEvent>);

impl TapSink {
    /// A sink sending to `tap`.
    pub fn new(tap: UnboundedSender<WireEvent>) -> TapSink {
        TapSink(tap)
    }
}

impl Sink for TapSink {
    fn accept(&self, event: &RunEvent) -> io::Result<()> {
        let t_ms = crate::timefmt::unix_ms();
        for kind in wire_of(event) {
            let _ = self.0.send(WireEvent { t_ms, kind });
        }
        Ok(())
    }
}

/// The wire events an event is sent as, in order (none for the journal's own records; a
/// stage's end is its `stage_finished`, then its stderr's last lines or its retry).
pub fn wire_of(event: &RunEvent) -> Vec<RunEventKind> {
    let text = |text: &String| RunEventKind::Text { text: text.clone() };
    vec![match event {
        RunEvent::RunStarted { .. } | RunEvent::RunPlanned { .. } | RunEvent::RunVerdict { .. } => {
            return Vec::new()
        }
        RunEvent::Note(t) => RunEventKind::Note { text: t.clone() },
        RunEvent::Warning(t) => RunEventKind::Warning { text: t.clone() },
        RunEvent::Detail(t) | RunEvent::Summary(t) => text(t),
        RunEvent::StageWaiting { stage, reason } => RunEventKind::StageWaiting {
            stage: stage.clone(),
            reason: reason.clone(),
        },
        RunEvent::StageStarted {
            stage,
            attempt,
            pid,
            placement,
            ..
        } => RunEventKind::StageStarted {
            stage: stage.clone(),
            attempt: *attempt,
            pid: *pid,
            placement: placement.clone(),
        },
        RunEvent::Progress(p) => RunEventKind::Progress {
            stage: p.stage.clone(),
            step: p.step,
            total: p.total,
            loss: p.loss,
            tokens_per_s: p.tokens_per_s,
        },
        RunEvent::StageFinished(end) => {
            let finished = RunEventKind::StageFinished {
                stage: end.stage.clone(),
                status: end.status,
                detail: end.detail(),
                wall_s: end.wall.unwrap_or_default().as_secs_f64(),
            };
            let block = end.stderr_block().map(|t| text(&t));
            return std::iter::once(finished)
                .chain(block)
                .chain(end.retrying())
                .collect();
        }
        RunEvent::StageSkipped {
            stage,
            class,
            reason,
        } => RunEventKind::StageSkipped {
            stage: stage.clone(),
            class: *class,
            reason: reason.clone(),
        },
        RunEvent::Reported(kind) => kind.clone(),
        RunEvent::RunFinished { status, exit_code } => RunEventKind::RunFinished {
            status: *status,
            exit_code: *exit_code,
        },
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::StageEnd;
    use protocol::status::{FailureClass, StageStatus};
    use std::time::Duration;

    fn failed(retry_in: Option<Duration>) -> RunEvent {
        RunEvent::StageFinished(Box::new(StageEnd {
            stage: "train".into(),
            attempt: 1,
            status: StageStatus::Failed,
            error: Some("exit status 1".into()),
            failure: Some(FailureClass::ExitCode),
            runs_again: retry_in.is_some(),
            lost_on: None,
            retry_in,
            wall: Some(Duration::from_secs(2)),
            plan_hash: String::new(),
            checkpoints: Vec::new(),
            metrics: Default::default(),
            stderr_tail: Some("Traceback".into()),
            facts: None,
        }))
    }

    #[test]
    fn a_retried_end_is_its_finish_then_its_retry_and_a_final_one_its_finish_then_its_stderr() {
        let retried = wire_of(&failed(Some(Duration::from_millis(500))));
        assert!(
            matches!(
                &retried[..],
                [RunEventKind::StageFinished { detail, .. }, RunEventKind::StageRetrying { attempt: 1, .. }]
                    if detail == "exit status 1; retrying in 0.5s"
            ),
            "{retried:?}"
        );
        let last = wire_of(&failed(None));
        assert!(
            matches!(
                &last[..],
                [RunEventKind::StageFinished { detail, .. }, RunEventKind::Text { text }]
                    if detail == "exit status 1"
                        && text == "---- last lines of train's stderr ----\nTraceback\n----\n"
            ),
            "{last:?}"
        );
    }

    #[test]
    fn a_skip_is_one_wire_event_and_the_journals_own_records_none() {
        let skip = RunEvent::StageSkipped {
            stage: "eval".into(),
            class: FailureClass::UpstreamFailed,
            reason: "upstream stage `train` did not succeed".into(),
        };
        assert_eq!(wire_of(&skip).len(), 1);
        let verdict = RunEvent::RunVerdict {
            status: protocol::status::RunStatus::Failed,
            exit_code: 1,
        };
        assert!(wire_of(&verdict).is_empty());
    }
}
