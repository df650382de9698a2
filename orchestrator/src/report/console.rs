//! What the user sees while a run goes: one line per stage event, on stderr — the console
//! as a sink of the run's [`RunEvent`]s. When stderr is a terminal, a live bar per running
//! stage and a run line are drawn below those lines ([`super::console_bars`]); when it is not
//! (a pipe, a file, a log collector), each progress report is a plain line instead.
//!
//! In `--log-format json` mode the same facts go out as structured tracing events instead,
//! for cluster log collectors.

use crate::events::{Progress, RunEvent, Sink, StageEnd};
use protocol::daemon::RunEventKind;
use protocol::status::StageStatus;
use std::time::Instant;

pub(crate) use crate::events::PROGRESS_EVERY;
pub use crate::timefmt::{human_duration, human_wall};

/// Writes to stderr, ignoring failure: a closed terminal or pipe (`orchestrate … | head`) must
/// not stop a run whose stages are running.
fn write_stderr(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Prints run progress: the sink of a run started from the command line.
#[derive(Debug, Clone)]
pub struct Console {
    json: bool,
    quiet: bool,
    start: Instant,
    /// A sweep's running count, when the plan is too large for a line per stage.
    sweep: std::sync::Arc<std::sync::Mutex<Option<Sweep>>>,
    /// The live bars, on a terminal (not in JSON or quiet mode).
    bars: Option<std::sync::Arc<super::console_bars::Bars>>,
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

impl Sink for Console {
    fn accept(&self, event: &RunEvent) -> std::io::Result<()> {
        match event {
            RunEvent::RunPlanned { stages } => {
                if let Some(bars) = &self.bars {
                    bars.planned(*stages);
                }
                self.plan_size(*stages)
            }
            RunEvent::Note(text) => self.note(text),
            RunEvent::Warning(text) => self.warn(text),
            RunEvent::Detail(text) => self.detail(text),
            RunEvent::Summary(text) => self.block(text),
            RunEvent::StageWaiting { stage, reason } => self.note(&format!("{stage}: {reason}")),
            RunEvent::StageStarted {
                stage,
                attempt,
                pid,
                placement,
                ..
            } => self.stage_started(stage, *attempt, *pid, placement),
            RunEvent::Progress(progress) => self.progress(progress),
            RunEvent::StageFinished(end) => self.stage_finished(end),
            RunEvent::Reported(kind) => self.warn_of(kind),
            // Retries and skips show no line of their own (the stage's end and the report say
            // them); the run's start, verdict and end are the journal's and the summary's.
            RunEvent::StageSkipped { .. } => {
                if let Some(bars) = &self.bars {
                    bars.skipped();
                }
            }
            RunEvent::RunFinished { .. } => {
                if let Some(bars) = &self.bars {
                    bars.end();
                }
            }
            RunEvent::RunStarted { .. } | RunEvent::RunVerdict { .. } => {}
        }
        Ok(())
    }
}

impl Console {
    /// A console; `json` routes everything through tracing, `quiet` prints only the summary.
    /// It draws live bars when stderr is a terminal that moves its cursor (not `TERM=dumb`),
    /// and neither `json` nor `quiet`.
    pub fn new(json: bool, quiet: bool) -> Console {
        use std::io::IsTerminal;
        let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
        let bars = (!json && !quiet && !dumb && std::io::stderr().is_terminal())
            .then(|| std::sync::Arc::new(super::console_bars::Bars::new()));
        Console {
            json,
            quiet,
            start: Instant::now(),
            sweep: Default::default(),
            bars,
        }
    }

    /// Past [`SWEEP_STAGES`] stages the console counts instead of listing every start and
    /// success.
    fn plan_size(&self, stages: usize) {
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
                super::console_bars::human_rate(rate)
            ));
        }
        !started && status != Some(StageStatus::Succeeded)
    }

    fn line(&self, text: &str) {
        if self.quiet {
            return;
        }
        let line = format!("[{:>7}] {text}", human_duration(self.start.elapsed()));
        match &self.bars {
            Some(bars) => bars.println(&line),
            None => write_stderr(&format!("{line}\n")),
        }
    }

    /// Writes a block as is, the bars cleared while it is written.
    fn write_block(&self, text: &str) {
        match &self.bars {
            Some(bars) => bars.suspend(|| write_stderr(text)),
            None => write_stderr(text),
        }
    }

    fn note(&self, text: &str) {
        if self.json {
            tracing::info!(target: "orchestrate::run", "{text}");
        } else {
            self.line(text);
        }
    }

    fn warn(&self, text: &str) {
        if self.json {
            tracing::warn!(target: "orchestrate::run", "{text}");
        } else {
            self.line(&format!("warning: {text}"));
        }
    }

    fn stage_started(&self, stage: &str, attempt: u32, pid: i32, placement: &str) {
        if let Some(bars) = &self.bars {
            bars.started(stage);
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

    fn progress(&self, p: &Progress) {
        let (stage, step, total, loss, rate) = (&p.stage, p.step, p.total, p.loss, p.tokens_per_s);
        if self.json {
            tracing::info!(target: "orchestrate::progress", stage, step, total, loss, tokens_per_s = rate, elapsed_s = p.elapsed.as_secs_f64(), "progress");
            return;
        }
        if let Some(bars) = &self.bars {
            return bars.progress(p);
        }
        let mut text = format!("{stage}: step {step}");
        if let Some(total) = total {
            text.push_str(&format!("/{total}"));
        }
        if let Some(loss) = loss {
            text.push_str(&format!("  loss {loss:.4}"));
        }
        if let Some(rate) = rate {
            text.push_str(&format!(
                "  {} tok/s",
                super::console_bars::human_rate(rate)
            ));
        }
        text.push_str(&format!("  {}", human_duration(p.elapsed)));
        self.line(&text);
    }

    /// A stage attempt's end, then its stderr's last lines after a final failure.
    fn stage_finished(&self, end: &StageEnd) {
        let (stage, status) = (&end.stage, end.status);
        let detail = end.detail();
        let wall = end.wall.unwrap_or_default();
        if let Some(bars) = &self.bars {
            bars.finished(stage, end.retry_in.is_none());
        }
        if self.json {
            tracing::info!(target: "orchestrate::stage", stage, status = status.as_str(), detail, wall_s = wall.as_secs_f64(), "stage finished");
        } else if self.count(false, Some(status)) {
            if detail.is_empty() {
                self.line(&format!("{stage}: {status} in {}", human_wall(wall)));
            } else {
                self.line(&format!(
                    "{stage}: {status} in {}: {detail}",
                    human_wall(wall)
                ));
            }
        }
        if let Some(block) = end.stderr_block() {
            self.detail(&block);
        }
    }

    /// A fact of the run's own, shown as a warning where it is one ([`warning_of`]).
    fn warn_of(&self, kind: &RunEventKind) {
        if let Some(text) = warning_of(kind) {
            self.warn(&text);
        }
    }

    /// Prints a block of text as is, unless quiet or in JSON mode.
    fn detail(&self, text: &str) {
        if self.quiet {
            return;
        }
        if self.json {
            tracing::info!(target: "orchestrate::run", detail = text, "detail");
        } else {
            self.write_block(text);
        }
    }

    /// Prints a block of text as is (the final summary), even when quiet; in JSON mode as a
    /// tracing event.
    fn block(&self, text: &str) {
        if self.json {
            tracing::info!(target: "orchestrate::run", summary = text, "run finished");
        } else {
            use std::io::IsTerminal;
            let colour = crate::table::colour_wanted(std::io::stderr().is_terminal());
            self.write_block(&crate::table::paint_status_lines(text, colour));
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
