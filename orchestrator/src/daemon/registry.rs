//! The daemon's runs: each one's state, its event log and watchers, its cancel handle.
//!
//! Every event of a run gets a sequence number (from 0, no gaps), is appended to
//! `<run>/events.jsonl` (written and flushed before anyone is told of it) and, while the run
//! goes, broadcast to watchers. Events are not kept in memory: a watcher replays what came
//! before it from the file, in bounded pieces ([`super::event_log`]), so the daemon's memory
//! grows neither with a run's events nor with the watchers that replay them.

use crate::attempt::launch::CancelLevel;
use protocol::daemon::{RunEvent, RunEventKind, RunInfo};
use protocol::status::RunStatus;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use tokio::sync::{broadcast, watch};

pub use super::event_log::Numbered;

/// File, in a run directory, of what the daemon knows about the submission.
pub const SUBMISSION_FILE: &str = "submission.json";
/// File, in a run directory, of the run's events (one JSON object per line).
pub const EVENTS_FILE: &str = "events.jsonl";
/// File, in a run directory, that says the daemon's own shutdown stopped the run (written
/// before the stop): the next daemon resumes it.
pub const STOPPED_FILE: &str = "stopped-by-daemon";

/// What a submission recorded, so a restarted daemon knows the run again.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Submission {
    /// The run's id.
    pub id: String,
    /// The client's id.
    pub client_id: Option<String>,
    /// Priority.
    pub priority: i32,
    /// When (Unix seconds).
    pub submitted_unix: f64,
    /// Stages in the plan.
    pub stages: usize,
}

/// One run.
pub struct RunEntry {
    /// Its submission.
    pub submission: Submission,
    /// Its directory.
    pub run_dir: PathBuf,
    /// Queued, running, or how it ended.
    pub state: RunStatus,
    /// Exit status once finished.
    pub exit_code: Option<i32>,
    /// When it finished.
    pub finished_unix: Option<f64>,
    succeeded: usize,
    /// Stages counted in `succeeded` from the journal of an earlier daemon (a recovered or
    /// resumed run), until they start again.
    earlier_successes: HashSet<String>,
    running: usize,
    waiting: BTreeMap<String, String>,
    event_count: u64,
    events_file: Option<std::io::BufWriter<std::fs::File>>,
    live: Option<broadcast::Sender<Numbered>>,
    /// Set to true when the run has ended.
    pub done: watch::Sender<bool>,
    /// Cancels the run.
    pub cancel: watch::Sender<CancelLevel>,
    /// The daemon's own shutdown stopped the run: it resumes when the daemon starts again, so
    /// its end here is not its outcome (see [`RunEntry::mark_stopped_by_daemon`]).
    stopped_by_daemon: bool,
}

impl RunEntry {
    /// A run about to start (or a finished one read back, with `finished` set).
    pub fn new(submission: Submission, run_dir: PathBuf) -> RunEntry {
        let events_path = run_dir.join(EVENTS_FILE);
        let event_count = super::event_log::count_lines(&events_path);
        let events_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&events_path)
            .ok()
            .map(std::io::BufWriter::new);
        RunEntry {
            submission,
            run_dir,
            state: RunStatus::Queued,
            exit_code: None,
            finished_unix: None,
            succeeded: 0,
            earlier_successes: HashSet::new(),
            running: 0,
            waiting: BTreeMap::new(),
            event_count,
            events_file,
            live: Some(broadcast::channel(1024).0),
            done: watch::channel(false).0,
            cancel: watch::channel(CancelLevel::None).0,
            stopped_by_daemon: false,
        }
    }

    /// Counts the stages an earlier daemon recorded as succeeded (from the run's journal, see
    /// [`succeeded_stages`](super::recover::succeeded_stages)), so a recovered run shows them and a
    /// resumed run's kept stages count; a stage that starts again here leaves the count until it
    /// succeeds again.
    pub fn count_earlier_successes(&mut self, stages: HashSet<String>) {
        self.succeeded = stages.len();
        self.earlier_successes = stages;
    }

    /// Records that the daemon's own shutdown is stopping this run (marked on disk by the
    /// caller): its end is then told as a stop, not as the run's outcome.
    pub fn mark_stopped_by_daemon(&mut self) {
        self.stopped_by_daemon = true;
    }

    /// Whether the daemon's own shutdown stopped the run (it resumes on the next start).
    pub fn stopped_by_daemon(&self) -> bool {
        self.stopped_by_daemon
    }

    /// The entry's public view.
    pub fn info(&self) -> RunInfo {
        RunInfo {
            id: self.submission.id.clone(),
            run_dir: self.run_dir.display().to_string(),
            state: self.state,
            exit_code: self.exit_code,
            client_id: self.submission.client_id.clone(),
            priority: self.submission.priority,
            submitted_unix: self.submission.submitted_unix,
            finished_unix: self.finished_unix,
            stages: self.submission.stages,
            succeeded: self.succeeded,
            running: self.running,
            waiting: self
                .waiting
                .iter()
                .map(|(stage, why)| format!("{stage}: {why}"))
                .collect(),
            events: self.event_count,
        }
    }

    /// Whether it has ended.
    pub fn finished(&self) -> bool {
        self.finished_unix.is_some()
    }

    /// Records one event of the run.
    pub fn push(&mut self, event: RunEvent) {
        self.state = RunStatus::Running;
        match &event.kind {
            RunEventKind::StageStarted { stage, .. } => {
                self.running += 1;
                self.waiting.remove(stage);
                self.forget_earlier_success(stage);
            }
            RunEventKind::StageFinished { stage, status, .. } => {
                self.running = self.running.saturating_sub(1);
                self.forget_earlier_success(stage);
                if *status == protocol::status::StageStatus::Succeeded {
                    self.succeeded += 1;
                }
            }
            RunEventKind::StageWaiting { stage, reason } => {
                self.waiting.insert(stage.clone(), reason.clone());
            }
            _ => {}
        }
        let event = self.as_told(event);
        if let Some(file) = &mut self.events_file {
            if let Ok(mut line) = serde_json::to_vec(&event) {
                line.push(b'\n');
                let _ = file.write_all(&line).and_then(|()| file.flush());
            }
        }
        let seq = self.event_count;
        self.event_count += 1;
        // Shared, not copied, by every watcher and page of the run.
        if let Some(live) = &self.live {
            let _ = live.send((seq, std::sync::Arc::new(event)));
        }
    }

    fn forget_earlier_success(&mut self, stage: &str) {
        if self.earlier_successes.remove(stage) {
            self.succeeded = self.succeeded.saturating_sub(1);
        }
    }

    /// The event as watchers and the event log get it: the end of a run the daemon's shutdown
    /// stopped is no end (the run resumes on the next start, as after a `kill -9`), so it is
    /// told as a note.
    fn as_told(&self, event: RunEvent) -> RunEvent {
        match event.kind {
            RunEventKind::RunFinished { .. } if self.stopped_by_daemon => RunEvent {
                t_ms: event.t_ms,
                kind: RunEventKind::Note {
                    text: "the daemon stopped: this run resumes when it starts again with the same --runs-dir".into(),
                },
            },
            _ => event,
        }
    }

    /// The run ended now: its outcome recorded, its watchers told.
    pub fn finish(&mut self, state: RunStatus, exit_code: i32) {
        self.finish_at(state, exit_code, crate::timefmt::unix_secs_f64());
    }

    /// The run ended at `finished_unix` (a recovered run: when its journal says).
    pub fn finish_at(&mut self, state: RunStatus, exit_code: i32, finished_unix: f64) {
        self.state = state;
        self.exit_code = Some(exit_code);
        self.finished_unix = Some(finished_unix);
        self.running = 0;
        self.earlier_successes = HashSet::new();
        self.waiting.clear();
        self.events_file = None;
        self.live = None;
        self.done.send_replace(true);
    }

    /// Where a watcher starts: how many events the run has had (those are in its event file,
    /// see [`RunEntry::events_path`]) and, while it goes, a receiver of the later ones.
    pub fn watch_point(&self) -> (u64, Option<broadcast::Receiver<Numbered>>) {
        (
            self.event_count,
            self.live.as_ref().map(broadcast::Sender::subscribe),
        )
    }

    /// The run's event file: line `n` is its event numbered `n`.
    pub fn events_path(&self) -> PathBuf {
        self.run_dir.join(EVENTS_FILE)
    }

    /// How many events it has had (each change of its counts is one).
    pub fn event_count(&self) -> u64 {
        self.event_count
    }

    /// While the run goes: how many events it has had, and a receiver of the later ones.
    pub fn follow(&self) -> Option<(u64, broadcast::Receiver<Numbered>)> {
        self.live
            .as_ref()
            .map(|l| (self.event_count, l.subscribe()))
    }
}

/// Every run of the daemon.
#[derive(Default)]
pub struct Registry {
    runs: HashMap<String, RunEntry>,
    order: Vec<String>,
    by_client: HashMap<String, String>,
}

impl Registry {
    /// Adds a run; its id must be new (see [`Registry::contains`]): an entry with an id
    /// already taken is not added (and a debug build panics).
    pub fn insert(&mut self, entry: RunEntry) {
        let id = entry.submission.id.clone();
        debug_assert!(!self.runs.contains_key(&id), "run id {id} registered twice");
        if self.runs.contains_key(&id) {
            tracing::error!(run = %id, "a second run with this id was not registered");
            return;
        }
        if let Some(client) = &entry.submission.client_id {
            // The first run submitted under a client id keeps it.
            self.by_client
                .entry(client.clone())
                .or_insert_with(|| id.clone());
        }
        self.order.push(id.clone());
        self.runs.insert(id, entry);
    }

    /// Whether a run has the id `id`.
    pub fn contains(&self, id: &str) -> bool {
        self.runs.contains_key(id)
    }

    /// The run with `id`.
    pub fn get(&self, id: &str) -> Option<&RunEntry> {
        self.runs.get(id)
    }

    /// The run with `id`, to change.
    pub fn get_mut(&mut self, id: &str) -> Option<&mut RunEntry> {
        self.runs.get_mut(id)
    }

    /// The run a client submitted under `client_id`.
    pub fn by_client(&self, client_id: &str) -> Option<&RunEntry> {
        self.by_client
            .get(client_id)
            .and_then(|id| self.runs.get(id))
    }

    /// Every run, in submission order.
    pub fn all(&self) -> impl Iterator<Item = &RunEntry> {
        self.order.iter().filter_map(|id| self.runs.get(id))
    }

    /// Runs not finished.
    pub fn running(&self) -> usize {
        self.runs.values().filter(|r| !r.finished()).count()
    }
}
