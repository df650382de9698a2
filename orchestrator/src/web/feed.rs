//! A live run's events as its pages receive them: one feed per run, however many pages are
//! open. The feed gathers the run's events of [`BATCH`], drops from a
//! large run's batch what a later event of the same batch supersedes ([`coalesce`]), encodes
//! the batch once, and hands the same bytes to every page's stream. A page then costs the
//! daemon one write per batch, not work per event.
//!
//! What a page receives, in order, as server-sent events (`data: {"seq", "event"}`):
//! - a run of fewer than [`LARGE_RUN`] stages: every event;
//! - a larger run: every event except a stage's status event (`stage_started`,
//!   `stage_waiting`, `stage_retrying`, `stage_finished`, `stage_skipped`) followed by another
//!   of the same stage in the same batch, and a stage's `progress` followed by another of its
//!   `progress` in the same batch. So each stage's latest state, its latest progress, every
//!   GPU verdict and every run-level event (`run_finished` included) always arrive; a sweep's
//!   `true` stage that starts and ends within 100 ms arrives as its `stage_finished` alone.
//!
//! The last event of each write carries `id: SEQ`, so a reconnecting `EventSource` resumes
//! after it.

use super::cadence::BATCH;
use super::frames::Frames;
use crate::daemon::event_log::EventReader;
use crate::daemon::registry::Numbered;
use crate::daemon::Daemon;
use protocol::daemon::RunEventKind;
use std::collections::HashSet;
use std::rc::Rc;
use tokio::sync::broadcast;

/// Runs of this many stages or more have their batches coalesced.
pub const LARGE_RUN: usize = 500;

/// Batches a slow page may fall behind before it catches up from the run's log.
pub const KEPT_BATCHES: usize = 64;

/// One batch of a run's events, encoded for every page.
pub struct Batch {
    /// The first sequence number the batch covers (some may have been coalesced away).
    pub from: u64,
    /// The last sequence number it covers (always an event it sends).
    pub to: u64,
    /// Each event sent, as its `data:` frame.
    pub pieces: Vec<(u64, Rc<[u8]>)>,
    /// All of them as one write.
    pub bytes: Rc<[u8]>,
}

impl Batch {
    /// The batch's events numbered `next` and later, as one write (the whole batch when it
    /// starts there).
    pub fn after(&self, next: u64) -> Option<Rc<[u8]>> {
        if self.to < next {
            None
        } else if self.from >= next {
            Some(self.bytes.clone())
        } else {
            let rest: Vec<_> = self
                .pieces
                .iter()
                .filter(|(seq, _)| *seq >= next)
                .cloned()
                .collect();
            Some(assemble(&rest).into())
        }
    }
}

/// The frames as one write, the last with its `id:` line.
pub fn assemble(pieces: &[(u64, Rc<[u8]>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(pieces.iter().map(|(_, p)| p.len()).sum::<usize>() + 24);
    if let Some(((last, final_piece), rest)) = pieces.split_last() {
        for (_, piece) in rest {
            out.extend_from_slice(piece);
        }
        out.extend_from_slice(format!("id: {last}\n").as_bytes());
        out.extend_from_slice(final_piece);
    }
    out
}

/// What a stage's event is superseded by, if anything: its next status event, or its next
/// progress.
fn key(kind: &RunEventKind) -> Option<(&str, bool)> {
    match kind {
        RunEventKind::StageStarted { stage, .. }
        | RunEventKind::StageWaiting { stage, .. }
        | RunEventKind::StageRetrying { stage, .. }
        | RunEventKind::StageFinished { stage, .. }
        | RunEventKind::StageSkipped { stage, .. } => Some((stage, true)),
        RunEventKind::Progress { stage, .. } => Some((stage, false)),
        _ => None,
    }
}

/// `events` without those a later one of the same stage supersedes (see the module's
/// promise), in their order.
pub fn coalesce(events: Vec<Numbered>) -> Vec<Numbered> {
    let keep: Vec<bool> = {
        let mut seen: HashSet<(&str, bool)> = HashSet::with_capacity(events.len());
        let mut keep: Vec<bool> = events
            .iter()
            .rev()
            .map(|(_, e)| key(&e.kind).is_none_or(|k| seen.insert(k)))
            .collect();
        keep.reverse();
        keep
    };
    events
        .into_iter()
        .zip(keep)
        .filter_map(|(e, k)| k.then_some(e))
        .collect()
}

/// The feeds of the runs that have a page open now, by run id, and the frames they encode.
#[derive(Default)]
pub struct Feeds {
    runs: std::cell::RefCell<std::collections::HashMap<String, broadcast::Sender<Rc<Batch>>>>,
    /// Event frames encoded once for every page.
    pub frames: Frames,
}

/// A page's view of run `id`: how many events it has now (the page reads them from the run's
/// event file, see the web API's `replay_to`) and, while the run goes, a receiver of the run's
/// feed, started now if no other page has it; `None` when there is no such run.
pub fn subscribe(daemon: &Rc<Daemon>, feeds: &Rc<Feeds>, id: &str) -> Option<Subscription> {
    let registry = daemon.registry.borrow();
    let run = registry.get(id)?;
    let large = run.submission.stages >= LARGE_RUN;
    let mut runs = feeds.runs.borrow_mut();
    let batches = match runs.get(id) {
        Some(tx) => Some(tx.subscribe()),
        None => run.follow().map(|(start, live)| {
            let (tx, rx) = broadcast::channel(KEPT_BATCHES);
            runs.insert(id.to_string(), tx.clone());
            let (daemon, feeds) = (daemon.clone(), feeds.clone());
            let id = id.to_string();
            tokio::task::spawn_local(feed(daemon, feeds, id, large, start, live, tx));
            rx
        }),
    };
    // Counted after the receiver exists and with no wait between: what the file has below the
    // count, the feed's batches do not need to.
    Some(Subscription {
        upto: run.event_count(),
        log: EventReader::new(&run.events_path()),
        batches,
        large,
    })
}

/// What [`subscribe`] gives a page.
pub struct Subscription {
    /// How many events the run had when the page subscribed: those are in `log`.
    pub upto: u64,
    /// The run's event file, read forward as the page needs it.
    pub log: EventReader,
    /// The feed's batches (`None` once the run has finished).
    pub batches: Option<broadcast::Receiver<Rc<Batch>>>,
    /// The run's batches are coalesced.
    pub large: bool,
}

/// Encodes `events` (numbered `next` and later) with the run's shared frames.
pub fn pieces(frames: &Frames, id: &str, events: &[Numbered], next: u64) -> Vec<(u64, Rc<[u8]>)> {
    events
        .iter()
        .filter(|(seq, _)| *seq >= next)
        .map(|(seq, event)| (*seq, frames.get(id, *seq, event)))
        .collect()
}

/// The feed of run `id`: its events from `next`, in batches, until the run's stream closes.
async fn feed(
    daemon: Rc<Daemon>,
    feeds: Rc<Feeds>,
    id: String,
    large: bool,
    mut next: u64,
    mut live: broadcast::Receiver<Numbered>,
    tx: broadcast::Sender<Rc<Batch>>,
) {
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};
    let mut log = match daemon.registry.borrow().get(&id) {
        Some(run) => EventReader::new(&run.events_path()),
        None => return,
    };
    loop {
        let mut events = match live.recv().await {
            Ok(numbered) => vec![numbered],
            Err(RecvError::Lagged(_)) => Vec::new(),
            Err(RecvError::Closed) => break,
        };
        // What else comes within the batch's time goes in the same batch.
        tokio::time::sleep(BATCH).await;
        let mut lagged = events.is_empty();
        let mut closed = false;
        loop {
            match live.try_recv() {
                Ok(numbered) => events.push(numbered),
                Err(TryRecvError::Lagged(_)) => lagged = true,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Closed) => {
                    closed = true;
                    break;
                }
            }
        }
        if lagged {
            // The feed fell behind the run: catch up from its log, a batch per piece.
            let count = daemon.registry.borrow().get(&id).map(|r| r.event_count());
            let Some(count) = count else { break };
            if !catch_up(&feeds.frames, &id, large, &tx, &mut log, &mut next, count).await {
                // No page left: the feed goes (the next page starts another).
                break;
            }
        }
        events.retain(|(seq, _)| *seq >= next);
        if let Some(&(to, _)) = events.last() {
            let from = next;
            next = to + 1;
            if !publish(&feeds.frames, &id, large, &tx, events, from) {
                break;
            }
        }
        if closed {
            break;
        }
    }
    feeds.runs.borrow_mut().remove(&id);
}

/// Sends the run's events from `*next` up to `upto` from its log, a batch per piece (see
/// [`crate::daemon::event_log`]); `false` when no page is left.
async fn catch_up(
    frames: &Frames,
    id: &str,
    large: bool,
    tx: &broadcast::Sender<Rc<Batch>>,
    log: &mut EventReader,
    next: &mut u64,
    upto: u64,
) -> bool {
    while *next < upto {
        let piece = log.piece(*next, upto);
        if let (Some(&(from, _)), Some(&(to, _))) = (piece.events.first(), piece.events.last()) {
            if !publish(frames, id, large, tx, piece.events, from) {
                return false;
            }
            *next = to + 1;
        }
        if piece.done {
            break;
        }
        tokio::task::yield_now().await;
    }
    true
}

/// Sends the feed's events numbered `from` and later (a run's events of one batch time, or
/// one piece of its log) to every page as one batch; `false` when no page is left.
fn publish(
    frames: &Frames,
    id: &str,
    large: bool,
    tx: &broadcast::Sender<Rc<Batch>>,
    events: Vec<Numbered>,
    from: u64,
) -> bool {
    let Some(&(to, _)) = events.last() else {
        return true;
    };
    let events = if large { coalesce(events) } else { events };
    let pieces = pieces(frames, id, &events, from);
    let bytes = assemble(&pieces).into();
    tx.send(Rc::new(Batch {
        from,
        to,
        pieces,
        bytes,
    }))
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::daemon::RunEvent;
    use protocol::status::StageStatus;
    use std::sync::Arc;

    fn started(stage: &str) -> RunEventKind {
        RunEventKind::StageStarted {
            stage: stage.into(),
            attempt: 1,
            pid: 1,
            placement: "cpu".into(),
        }
    }
    fn finished(stage: &str, status: StageStatus) -> RunEventKind {
        RunEventKind::StageFinished {
            stage: stage.into(),
            status,
            detail: String::new(),
            wall_s: 0.01,
        }
    }
    fn progress(stage: &str, step: u64) -> RunEventKind {
        RunEventKind::Progress {
            stage: stage.into(),
            step,
            total: None,
            loss: None,
            tokens_per_s: None,
        }
    }
    fn numbered(kinds: Vec<RunEventKind>) -> Vec<Numbered> {
        kinds
            .into_iter()
            .enumerate()
            .map(|(i, kind)| {
                (
                    i as u64 + 10,
                    Arc::new(RunEvent {
                        t_ms: i as u64,
                        kind,
                    }),
                )
            })
            .collect()
    }

    #[test]
    fn a_batch_keeps_each_stages_latest_state_and_every_other_event() {
        let events = numbered(vec![
            started("a"),                            // 10: superseded by 13
            started("b"),                            // 11: b's latest
            progress("b", 1),                        // 12: superseded by 14
            finished("a", StageStatus::Succeeded),   // 13
            progress("b", 2),                        // 14
            RunEventKind::Note { text: "n".into() }, // 15
            started("c"),                            // 16: superseded by 17
            finished("c", StageStatus::Failed),      // 17: superseded by 18
            RunEventKind::StageRetrying {
                stage: "c".into(),
                attempt: 1,
                error: "e".into(),
                retry_in_s: 1.0,
            }, // 18
            RunEventKind::RunFinished {
                status: protocol::status::RunStatus::Failed,
                exit_code: 1,
            }, // 19
        ]);
        let kept: Vec<u64> = coalesce(events).iter().map(|(s, _)| *s).collect();
        assert_eq!(kept, vec![11, 13, 14, 15, 18, 19]);
    }

    #[test]
    fn a_batch_is_sent_from_where_a_page_is() {
        let pieces: Vec<(u64, Rc<[u8]>)> = (5..8)
            .map(|s| (s, Rc::from(format!("data: {s}\n\n").into_bytes())))
            .collect();
        let bytes: Rc<[u8]> = assemble(&pieces).into();
        assert_eq!(&*bytes, b"data: 5\n\ndata: 6\n\nid: 7\ndata: 7\n\n");
        let batch = Batch {
            from: 3,
            to: 7,
            pieces,
            bytes: bytes.clone(),
        };
        assert!(Rc::ptr_eq(&batch.after(2).unwrap(), &bytes));
        assert_eq!(&*batch.after(6).unwrap(), b"data: 6\n\nid: 7\ndata: 7\n\n");
        assert!(batch.after(8).is_none());
    }
}
