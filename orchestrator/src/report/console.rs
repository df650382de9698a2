//! What the user sees while a run goes: one line per stage event, on stderr.
//!
//! In `--log-format json` mode the same facts go out as structured tracing events instead,
//! for cluster log collectors. Every fact is also a timestamped [`RunEvent`] sent to the
//! console's tap when it has one: the daemon's per-run event log and its watchers read the
//! same stream the terminal shows.

use protocol::daemon::{RunEvent, RunEventKind};
use protocol::status::{RunStatus, StageStatus};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// Writes to stderr, ignoring failure: a closed terminal or pipe (`orchestrate … | head`) must
/// not stop a run whose stages are running.
fn write_stderr(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Prints run progress.
#[derive(Debug, Clone)]
pub struct Console {
    json: bool,
    quiet: bool,
    start: Instant,
    /// What each stage's progress showed last (see [`Console::progress`]).
    last_progress: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Shown>>>,
    /// Nothing on stderr at all (a daemon's runs): events go to the tap only.
    silent: bool,
    /// Where every event also goes.
    tap: Option<UnboundedSender<RunEvent>>,
    /// A sweep's running count, when the plan is too large for a line per stage.
    sweep: std::sync::Arc<std::sync::Mutex<Option<Sweep>>>,
}

/// Past this many stages, the terminal shows a count every [`PROGRESS_EVERY`] and the stages
/// that did not succeed, not a line for every start and end (events and JSON logs still have
/// every one).
pub(crate) const SWEEP_STAGES: usize = 100;

/// The running count of a sweep.
#[derive(Debug)]
struct Sweep {
    total: usize,
    finished: usize,
    succeeded: usize,
    running: usize,
    last_shown: Instant,
    started: Instant,
}

/// A stage's progress is shown at most this often (a stage may report every step).
pub(crate) const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// The progress a stage attempt last showed: when, and whether it showed its last step.
#[derive(Debug, Clone, Copy)]
struct Shown {
    at: Instant,
    last_step: bool,
}

/// Whether a stage attempt's next progress event is shown (and sent as a run event), given
/// what it showed before (its first always is): at most one per [`PROGRESS_EVERY`], except that
/// the first to reach its total is shown at once. Only the first: a stage that repeats
/// `step >= total` is throttled like any other, whatever its fields claim.
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

fn human_rate(rate: f64) -> String {
    if rate >= 1e6 {
        format!("{:.1}M", rate / 1e6)
    } else if rate >= 1e3 {
        format!("{:.1}k", rate / 1e3)
    } else {
        format!("{rate:.0}")
    }
}

/// `1.2s`, `3m04s`, `1h02m`.
pub(crate) fn human_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!(
            "{}h{:02}m",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    }
}

impl Console {
    /// A console; `json` routes everything through tracing, `quiet` prints only the summary.
    pub fn new(json: bool, quiet: bool) -> Console {
        Console {
            json,
            quiet,
            start: Instant::now(),
            last_progress: Default::default(),
            silent: false,
            tap: None,
            sweep: Default::default(),
        }
    }

    /// Tells the console how many stages the run has: past [`SWEEP_STAGES`] it counts instead
    /// of listing every start and success.
    pub(crate) fn plan_size(&self, stages: usize) {
        if stages > SWEEP_STAGES {
            let now = Instant::now();
            *self.sweep.lock().unwrap_or_else(|e| e.into_inner()) = Some(Sweep {
                total: stages,
                finished: 0,
                succeeded: 0,
                running: 0,
                last_shown: now,
                started: now,
            });
        }
    }

    /// Counts a start or an end in a sweep; returns whether the event is to be shown on its
    /// own line (everything outside a sweep; in one, ends that did not succeed), and shows the
    /// count when it is due.
    fn count(&self, started: bool, status: Option<StageStatus>) -> bool {
        let mut sweep = self.sweep.lock().unwrap_or_else(|e| e.into_inner());
        let Some(sweep) = sweep.as_mut() else {
            return true;
        };
        if started {
            sweep.running += 1;
        } else {
            sweep.running = sweep.running.saturating_sub(1);
            sweep.finished += 1;
            if status == Some(StageStatus::Succeeded) {
                sweep.succeeded += 1;
            }
        }
        let now = Instant::now();
        let last = sweep.finished == sweep.total;
        if now.duration_since(sweep.last_shown) >= PROGRESS_EVERY || last && !started {
            sweep.last_shown = now;
            let rate = sweep.finished as f64 / now.duration_since(sweep.started).as_secs_f64();
            let others = sweep.finished - sweep.succeeded;
            self.line(&format!(
                "{} of {} stages finished ({} succeeded{}), {} running, {} stages/s",
                sweep.finished,
                sweep.total,
                sweep.succeeded,
                if others > 0 {
                    format!(", {others} did not")
                } else {
                    String::new()
                },
                sweep.running,
                human_rate(rate)
            ));
        }
        !started && status != Some(StageStatus::Succeeded)
    }

    /// A console that prints nothing and sends every event to `tap`.
    pub(crate) fn silent(tap: UnboundedSender<RunEvent>) -> Console {
        Console {
            silent: true,
            tap: Some(tap),
            ..Console::new(false, true)
        }
    }

    /// Sends the event `kind` makes to the tap, if there is one (made only then: a sweep
    /// run from the command line has none).
    fn emit(&self, kind: impl FnOnce() -> RunEventKind) {
        if let Some(tap) = &self.tap {
            let _ = tap.send(RunEvent {
                t_ms: crate::timefmt::unix_ms(),
                kind: kind(),
            });
        }
    }

    /// A stage waits for GPUs (to the tap; on the terminal as a note).
    pub fn waiting(&self, stage: &str, reason: &str) {
        self.emit(|| RunEventKind::StageWaiting {
            stage: stage.to_string(),
            reason: reason.to_string(),
        });
        if !self.silent {
            self.note(&format!("{stage}: {reason}"));
        }
    }

    /// The run ended (to the tap only; the summary is a [`Console::block`]).
    pub(crate) fn run_finished(&self, status: RunStatus, exit_code: i32) {
        self.emit(|| RunEventKind::RunFinished { status, exit_code });
    }

    fn line(&self, text: &str) {
        if !self.quiet && !self.silent {
            write_stderr(&format!(
                "[{:>7}] {text}\n",
                human_duration(self.start.elapsed())
            ));
        }
    }

    /// A general note about the run.
    pub(crate) fn note(&self, text: &str) {
        self.emit(|| RunEventKind::Note {
            text: text.to_string(),
        });
        if self.silent {
            return;
        }
        if self.json {
            tracing::info!(target: "orchestrate::run", "{text}");
        } else {
            self.line(text);
        }
    }

    /// A warning the user should read.
    pub fn warn(&self, text: &str) {
        self.emit(|| RunEventKind::Warning {
            text: text.to_string(),
        });
        if self.silent {
            return;
        }
        if self.json {
            tracing::warn!(target: "orchestrate::run", "{text}");
        } else {
            self.line(&format!("warning: {text}"));
        }
    }

    /// A stage attempt started.
    pub(crate) fn stage_started(&self, stage: &str, attempt: u32, pid: i32, placement: &str) {
        self.emit(|| RunEventKind::StageStarted {
            stage: stage.to_string(),
            attempt,
            pid,
            placement: placement.to_string(),
        });
        if self.silent {
            return;
        }
        if self.json {
            tracing::info!(target: "orchestrate::stage", stage, attempt, pid, placement, "stage started");
        } else if self.count(true, None) {
            let again = if attempt > 1 {
                format!(" (attempt {attempt})")
            } else {
                String::new()
            };
            self.line(&format!(
                "{stage}: started{again}, pid {pid}, on {placement}"
            ));
        }
    }

    /// A progress event.
    pub(crate) fn progress(
        &self,
        stage: &str,
        step: u64,
        total: Option<u64>,
        loss: Option<f64>,
        rate: Option<f64>,
        elapsed: Duration,
    ) {
        let last_step = total.is_some_and(|t| step >= t);
        {
            let mut shown = self.last_progress.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            match shown.get_mut(stage) {
                Some(before) => {
                    if !progress_due(before, last_step, now) {
                        return;
                    }
                }
                None => {
                    shown.insert(stage.to_string(), Shown { at: now, last_step });
                }
            }
        }
        self.emit(|| RunEventKind::Progress {
            stage: stage.to_string(),
            step,
            total,
            loss,
            tokens_per_s: rate,
        });
        if self.silent {
            return;
        }
        if self.json {
            tracing::info!(target: "orchestrate::progress", stage, step, total, loss, tokens_per_s = rate, elapsed_s = elapsed.as_secs_f64(), "progress");
            return;
        }
        let mut text = format!("{stage}: step {step}");
        if let Some(total) = total {
            text.push_str(&format!("/{total}"));
        }
        if let Some(loss) = loss {
            text.push_str(&format!("  loss {loss:.4}"));
        }
        if let Some(rate) = rate {
            text.push_str(&format!("  {} tok/s", human_rate(rate)));
        }
        text.push_str(&format!("  {}", human_duration(elapsed)));
        self.line(&text);
    }

    /// A stage attempt ended.
    pub(crate) fn stage_finished(
        &self,
        stage: &str,
        status: StageStatus,
        detail: &str,
        wall: Duration,
    ) {
        self.emit(|| RunEventKind::StageFinished {
            stage: stage.to_string(),
            status,
            detail: detail.to_string(),
            wall_s: wall.as_secs_f64(),
        });
        // The progress map keeps stages that report progress, until they end.
        self.last_progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(stage);
        if self.silent {
            return;
        }
        if self.json {
            tracing::info!(target: "orchestrate::stage", stage, status = status.as_str(), detail, wall_s = wall.as_secs_f64(), "stage finished");
        } else if self.count(false, Some(status)) {
            if detail.is_empty() {
                self.line(&format!("{stage}: {status} in {}", human_duration(wall)));
            } else {
                self.line(&format!(
                    "{stage}: {status} in {}: {detail}",
                    human_duration(wall)
                ));
            }
        }
    }

    /// A typed event of the run's own (a retry, a skip, a GPU not reclaimed or quarantined,
    /// the run stopping): sent to the tap, and shown as a warning where it is one
    /// ([`warning_of`]); retries and skips show no line of their own (the stage's end and the
    /// report say them).
    pub fn event(&self, kind: RunEventKind) {
        let warning = warning_of(&kind);
        self.emit(|| kind);
        if let Some(text) = warning.filter(|_| !self.silent) {
            if self.json {
                tracing::warn!(target: "orchestrate::run", "{text}");
            } else {
                self.line(&format!("warning: {text}"));
            }
        }
    }

    /// Prints a block of text as is (a resume plan, a results table, a failed stage's stderr),
    /// unless quiet or in JSON mode.
    pub fn detail(&self, text: &str) {
        self.emit(|| RunEventKind::Text {
            text: text.to_string(),
        });
        if self.quiet || self.silent {
            return;
        }
        if self.json {
            tracing::info!(target: "orchestrate::run", detail = text, "detail");
        } else {
            write_stderr(text);
        }
    }

    /// Prints a block of text as is (the final summary), even when quiet; in JSON mode as a
    /// tracing event.
    pub fn block(&self, text: &str) {
        self.emit(|| RunEventKind::Text {
            text: text.to_string(),
        });
        if self.silent {
            return;
        }
        if self.json {
            tracing::info!(target: "orchestrate::run", summary = text, "run finished");
        } else {
            write_stderr(text);
        }
    }
}

/// The warning a typed event is shown as, if it is one.
pub fn warning_of(kind: &RunEventKind) -> Option<String> {
    use protocol::status::FailureClass;
    match kind {
        RunEventKind::GpuNotReclaimed {
            stage,
            uuid,
            verdict,
            baseline_bytes,
            after_bytes,
            reclaim_ms,
            holders,
            note,
        } => {
            let mib = after_bytes.saturating_sub(*baseline_bytes) / (1 << 20);
            if *verdict == protocol::report::GpuVerdict::TakenByOther {
                return Some(format!(
                    "{stage}: GPU {uuid} is busy, not leaked: {mib} MiB above its baseline are held by {}, outside the stage's tree; stages wait for it to be empty",
                    holders.join(", ")
                ));
            }
            let mut line = format!(
                "{stage}: GPU {uuid} leaked: {mib} MiB above its baseline after {} ms",
                *reclaim_ms as u64
            );
            if !holders.is_empty() {
                line.push_str(&format!("; held by {}", holders.join(", ")));
            }
            if let Some(note) = note {
                line.push_str(&format!(" ({note})"));
            }
            Some(line)
        }
        RunEventKind::StageOomKilled {
            stage,
            attempt,
            oom_kills,
            peak_bytes,
            limit_bytes,
        } => {
            let mib = |b: &Option<u64>| b.map_or("?".to_string(), |b| format!("{} MiB", b >> 20));
            Some(format!(
                "{stage}: attempt {attempt}: the kernel's OOM killer ended {oom_kills} process(es) of its cgroup (memory limit {}, peak {})",
                mib(limit_bytes),
                mib(peak_bytes)
            ))
        }
        RunEventKind::GpuQuarantined { uuid } => Some(format!(
            "GPU {uuid} quarantined: no further stage will run on it"
        )),
        RunEventKind::RunStopping {
            reason: FailureClass::FailFast,
        } => Some("a stage failed and fail_fast = true: no further stage starts".into()),
        RunEventKind::RunStopping {
            reason: FailureClass::GpuLeaked,
        } => Some(
            "a GPU leaked and on_leak = \"fail\": no further stage starts; the run will exit with code 3"
                .into(),
        ),
        _ => None,
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

    #[test]
    fn a_host_oom_kill_is_a_warning_naming_the_limit_and_the_peak() {
        let line = warning_of(&RunEventKind::StageOomKilled {
            stage: "prep".into(),
            attempt: 2,
            oom_kills: 1,
            peak_bytes: Some(256 << 20),
            limit_bytes: Some(256 << 20),
        })
        .expect("a warning");
        assert_eq!(
            line,
            "prep: attempt 2: the kernel's OOM killer ended 1 process(es) of its cgroup (memory limit 256 MiB, peak 256 MiB)"
        );
    }
}
