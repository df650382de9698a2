//! The run's event stream: every fact a run tells anyone leaves as one typed [`RunEvent`],
//! and the [`Events`] handle fans it out to the registered [`Sink`]s — the console (text or
//! JSON), the journal ([`journal::JournalSink`]), the daemon's per-run feed ([`tap::TapSink`]),
//! and the report, which keeps every stage's record from them.
//! A fact is emitted once; each sink takes what it shows or records from it.
//!
//! This module sits low: it knows the wire and journal types and plain data, nothing of how a
//! run is carried out or shown.

pub mod journal;
pub mod tap;

use protocol::daemon::RunEventKind;
use protocol::report::{CheckpointRecord, GpuRecord, HostUsage, StageStart, StageTiming};
use protocol::status::{FailureClass, RunStatus, StageStatus};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One fact of a run, with everything each of its readers needs.
#[derive(Debug, Clone)]
pub enum RunEvent {
    /// The run began (journal only): its plan, this process, its GPU check, whether it resumes.
    RunStarted {
        /// The plan's source name.
        plan: String,
        /// `orchestrate`'s process id.
        pid: u32,
        /// The GPU check, as the journal describes it.
        gpu_check: String,
        /// Whether the run continues one already in its directory.
        resumed: bool,
    },
    /// How many stages the plan has (the console counts a large sweep instead of listing it).
    RunPlanned {
        /// Stages in the plan.
        stages: usize,
    },
    /// A general note about the run.
    Note(String),
    /// A warning the user should read.
    Warning(String),
    /// A block of text shown as is unless the console is quiet (a resume plan, a results table).
    Detail(String),
    /// A block of text shown as is even when quiet (the final summary).
    Summary(String),
    /// A stage waits (for GPUs), and why.
    StageWaiting {
        /// Stage.
        stage: String,
        /// Why.
        reason: String,
    },
    /// A stage attempt started.
    StageStarted {
        /// Stage.
        stage: String,
        /// Attempt, from 1.
        attempt: u32,
        /// Its first process.
        pid: i32,
        /// Where it runs, for a human ("cpu", its GPUs, how it was started).
        placement: String,
        /// The UUIDs of the GPUs it was given.
        gpus: Vec<String>,
        /// The stage's plan hash.
        plan_hash: String,
    },
    /// A stage's progress (rate-limited by [`Events::progress`]).
    Progress(Progress),
    /// A stage attempt ended.
    StageFinished(Box<StageEnd>),
    /// A stage will not run.
    StageSkipped {
        /// Stage.
        stage: String,
        /// Why, as a class.
        class: FailureClass,
        /// Why, for a human.
        reason: String,
    },
    /// A fact every reader takes as the daemon's wire has it: a GPU not reclaimed or
    /// quarantined, a host OOM kill, the run stopping, a stage's GPU verdicts. The console
    /// shows it as a warning where it is one.
    Reported(RunEventKind),
    /// The run's verdict, decided (journal only): what it ended as and the exit status.
    RunVerdict {
        /// Its status.
        status: RunStatus,
        /// `orchestrate`'s exit status.
        exit_code: i32,
    },
    /// The run ended: every file it writes is written. Its last event.
    RunFinished {
        /// Its status.
        status: RunStatus,
        /// `orchestrate`'s exit status.
        exit_code: i32,
    },
}

/// A stage's progress, as its worker reported it.
#[derive(Debug, Clone)]
pub struct Progress {
    /// Stage.
    pub stage: String,
    /// Step.
    pub step: u64,
    /// Total steps, if known.
    pub total: Option<u64>,
    /// Loss.
    pub loss: Option<f64>,
    /// Tokens per second.
    pub tokens_per_s: Option<f64>,
    /// Time since the attempt started.
    pub elapsed: Duration,
}

/// The end of a stage attempt: how it ended and what it left.
#[derive(Debug, Clone)]
pub struct StageEnd {
    /// Stage.
    pub stage: String,
    /// Attempt, from 1.
    pub attempt: u32,
    /// How it ended.
    pub status: StageStatus,
    /// Why it did not succeed.
    pub error: Option<String>,
    /// The class of its failure, when it failed.
    pub failure: Option<FailureClass>,
    /// Whether the stage runs again: a retry (see `retry_in`), or an early start made void,
    /// which waits for its upstream stages again. Until then it stands as pending.
    pub runs_again: bool,
    /// The node a placed step was lost on, if it was.
    pub lost_on: Option<String>,
    /// When it is tried again, if it is.
    pub retry_in: Option<Duration>,
    /// The attempt's wall time; `None` when it never ran.
    pub wall: Option<Duration>,
    /// The stage's plan hash.
    pub plan_hash: String,
    /// The outputs it wrote (kept only when it succeeded).
    pub checkpoints: Vec<CheckpointRecord>,
    /// The last metrics it reported.
    pub metrics: BTreeMap<String, f64>,
    /// The last lines of its stderr.
    pub stderr_tail: Option<String>,
    /// What else the attempt left, for the report; `None` when it never ran (with `wall`).
    pub facts: Option<Box<AttemptFacts>>,
}

/// What an attempt that ran left beyond its outputs, metrics and stderr: how its first process
/// ended, its GPUs' verdicts, its milestones and what its processes used.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttemptFacts {
    /// The first process's exit code, if it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended the first process, by name, if one did.
    pub signal: Option<String>,
    /// Per-GPU verification.
    pub gpu: Vec<GpuRecord>,
    /// Processes that outlived the first process and had to be stopped ("pid N (name)").
    pub leftover_processes: Vec<String>,
    /// Malformed messages received.
    pub protocol_violations: Vec<String>,
    /// Milestones (absent for an attempt that never started).
    pub timing: Option<StageTiming>,
    /// CPU time and memory of the stage's processes.
    pub host: Option<HostUsage>,
    /// Stages with `preload`: how its first process was started.
    pub start: Option<StageStart>,
    /// It was started early, ahead of an upstream stage still persisting its outputs.
    pub started_early: bool,
}

impl StageEnd {
    /// The end's detail for a human: the error, where the step was lost, when it is retried.
    pub fn detail(&self) -> String {
        let lost = self
            .lost_on
            .as_ref()
            .map(|node| format!(" (lost on node {node})"))
            .unwrap_or_default();
        match (&self.error, self.retry_in) {
            (Some(e), Some(wait)) => format!(
                "{e}{lost}; retrying in {}",
                crate::timefmt::human_duration(wait)
            ),
            (Some(e), None) => format!("{e}{lost}"),
            (None, _) => String::new(),
        }
    }

    /// The block of its stderr's last lines shown after a final failure (none for a success,
    /// a retry, or an empty tail).
    pub fn stderr_block(&self) -> Option<String> {
        let tail = self.stderr_tail.as_deref()?;
        (self.status == StageStatus::Failed && self.retry_in.is_none() && !tail.trim().is_empty())
            .then(|| {
                format!(
                    "---- last lines of {}'s stderr ----\n{tail}\n----\n",
                    self.stage
                )
            })
    }

    /// The retry this end announces, as the wire has it.
    pub fn retrying(&self) -> Option<RunEventKind> {
        let (error, wait) = (self.error.as_ref()?, self.retry_in?);
        Some(RunEventKind::StageRetrying {
            stage: self.stage.clone(),
            attempt: self.attempt,
            error: error.clone(),
            retry_in_s: wait.as_secs_f64(),
        })
    }
}

/// A reader of the run's events. Sinks are called in the order they were added, on the thread
/// that emits; each must be quick (a channel send, a line on stderr, a journal write).
pub trait Sink: Send + Sync {
    /// Takes one event. An error (a journal that cannot be written) is the run's to handle.
    fn accept(&self, event: &RunEvent) -> io::Result<()>;
}

/// The handle every part of a run emits through: cheap to clone, shared by the run's tasks.
#[derive(Clone, Default)]
pub struct Events {
    sinks: Arc<[Arc<dyn Sink>]>,
    /// What each stage's progress showed last (see [`Events::progress`]).
    last_progress: Arc<Mutex<HashMap<String, Shown>>>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("sinks", &self.sinks.len())
            .finish()
    }
}

/// A stage's progress is shown at most this often (a stage may report every step).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// The progress a stage attempt last showed: when, and whether it showed its last step.
#[derive(Debug, Clone, Copy)]
struct Shown {
    at: Instant,
    last_step: bool,
}

/// Whether a stage attempt's next progress event is emitted, given what it showed before (its
/// first always is): at most one per [`PROGRESS_EVERY`], except that the first to reach its
/// total is shown at once. Only the first: a stage that repeats `step >= total` is throttled
/// like any other, whatever its fields claim.
fn progress_due(shown: &mut Shown, last_step: bool, now: Instant) -> bool {
    let due = now.duration_since(shown.at) >= PROGRESS_EVERY || (last_step && !shown.last_step);
    if due {
        *shown = Shown {
            at: now,
            last_step: shown.last_step || last_step,
        };
    }
    due
}

impl Events {
    /// A stream no one reads (until sinks are added with [`Events::with`]).
    pub fn new() -> Events {
        Events::default()
    }

    /// A handle that sends to these sinks and then to `sink` (this one is unchanged); it
    /// shares this one's progress throttle.
    pub fn with(&self, sink: impl Sink + 'static) -> Events {
        let mut sinks: Vec<Arc<dyn Sink>> = self.sinks.to_vec();
        sinks.push(Arc::new(sink));
        Events {
            sinks: sinks.into(),
            last_progress: self.last_progress.clone(),
        }
    }

    /// Sends `event` to every sink, in order; every sink sees it even when one fails, and the
    /// first failure is returned.
    pub fn emit(&self, event: RunEvent) -> io::Result<()> {
        if let RunEvent::StageFinished(end) = &event {
            // The progress map keeps stages that report progress, until they end (most
            // report none: an empty map is left without hashing the name).
            let mut shown = self.last_progress.lock().unwrap_or_else(|e| e.into_inner());
            if !shown.is_empty() {
                shown.remove(&end.stage);
            }
        }
        let mut first = Ok(());
        for sink in self.sinks.iter() {
            let accepted = sink.accept(&event);
            if first.is_ok() {
                first = accepted;
            }
        }
        first
    }

    /// Emits an event that no sink can fail on (only the journal fails, and it records none
    /// of these: notes, warnings, text, progress, waits, reported facts).
    fn tell(&self, event: RunEvent) {
        let _ = self.emit(event);
    }

    /// A general note about the run.
    pub fn note(&self, text: &str) {
        self.tell(RunEvent::Note(text.to_string()));
    }

    /// A warning the user should read.
    pub fn warn(&self, text: &str) {
        self.tell(RunEvent::Warning(text.to_string()));
    }

    /// A block of text shown unless quiet (a resume plan, a results table, a stderr tail).
    pub fn detail(&self, text: &str) {
        self.tell(RunEvent::Detail(text.to_string()));
    }

    /// A block of text shown even when quiet (the final summary).
    pub fn summary(&self, text: &str) {
        self.tell(RunEvent::Summary(text.to_string()));
    }

    /// A fact as the wire has it (see [`RunEvent::Reported`]).
    pub fn report(&self, kind: RunEventKind) {
        self.tell(RunEvent::Reported(kind));
    }

    /// A stage's progress, emitted only when due: a stage attempt's first, then at most one
    /// per [`PROGRESS_EVERY`], and the first that reaches its total at once.
    pub fn progress(&self, progress: Progress) {
        let last_step = progress.total.is_some_and(|t| progress.step >= t);
        {
            let mut shown = self.last_progress.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            match shown.get_mut(&progress.stage) {
                Some(before) => {
                    if !progress_due(before, last_step, now) {
                        return;
                    }
                }
                None => {
                    shown.insert(progress.stage.clone(), Shown { at: now, last_step });
                }
            }
        }
        self.tell(RunEvent::Progress(progress));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_final_step_skips_the_progress_throttle() {
        let t0 = Instant::now();
        let mut shown = Shown {
            at: t0,
            last_step: false,
        };
        let soon = t0 + Duration::from_millis(10);
        assert!(
            !progress_due(&mut shown, false, soon),
            "within the interval"
        );
        assert!(progress_due(&mut shown, true, soon), "the first final step");
        let repeats = (0..20_000)
            .filter(|_| progress_due(&mut shown, true, soon))
            .count();
        assert_eq!(repeats, 0, "repeated final steps are throttled");
        assert!(progress_due(&mut shown, true, soon + PROGRESS_EVERY));
    }

    /// Keeps every event it is given.
    #[derive(Default)]
    struct Kept(Mutex<Vec<String>>);

    impl Sink for Arc<Kept> {
        fn accept(&self, event: &RunEvent) -> io::Result<()> {
            self.0.lock().unwrap().push(format!("{event:?}"));
            match event {
                RunEvent::Warning(_) => Err(io::Error::other("refused")),
                _ => Ok(()),
            }
        }
    }

    #[test]
    fn every_sink_sees_every_event_even_after_one_fails() {
        let (a, b) = (Arc::new(Kept::default()), Arc::new(Kept::default()));
        let events = Events::new().with(a.clone()).with(b.clone());
        assert!(events.emit(RunEvent::Warning("w".into())).is_err());
        events.note("n");
        assert_eq!(a.0.lock().unwrap().len(), 2);
        assert_eq!(*a.0.lock().unwrap(), *b.0.lock().unwrap());
    }

    #[test]
    fn a_stage_attempt_shows_its_first_progress_and_not_the_next_at_once() {
        let kept = Arc::new(Kept::default());
        let events = Events::new().with(kept.clone());
        let progress = |step| Progress {
            stage: "train".into(),
            step,
            total: Some(10),
            loss: None,
            tokens_per_s: None,
            elapsed: Duration::ZERO,
        };
        events.progress(progress(1));
        events.progress(progress(2));
        assert_eq!(kept.0.lock().unwrap().len(), 1);
        events.progress(progress(10));
        assert_eq!(kept.0.lock().unwrap().len(), 2, "its last step at once");
    }
}
