//! The console's live bars on a terminal: one bar per running stage (its step of its total,
//! loss, tokens/s and ETA) under a run line (stages finished of all, and the run's ETA), drawn
//! by `indicatif` on stderr. Lines the console prints go above the bars, which are redrawn
//! below them; blocks of text (a stderr tail, the summary) are printed with the bars cleared.
//!
//! Only for a terminal: when stderr is not one, the console prints its plain lines as before.

use crate::events::Progress;
use crate::timefmt::human_duration;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most this many stages have a bar at once (a sweep may run hundreds; the run line counts
/// them all).
const MAX_BARS: usize = 12;
/// A stage name is cut to this many characters in its bar's label.
const MAX_LABEL: usize = 40;

/// The bars of one run.
pub struct Bars {
    multi: MultiProgress,
    state: Mutex<State>,
}

impl std::fmt::Debug for Bars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bars").finish_non_exhaustive()
    }
}

struct State {
    run: ProgressBar,
    started: Instant,
    total: usize,
    finished: usize,
    /// Running stages: their bar (if they have one) and their fraction done.
    stages: HashMap<String, Running>,
    label_width: usize,
}

struct Running {
    bar: Option<ProgressBar>,
    done: f64,
    /// When it is expected to end, from its pace so far.
    ends: Option<Instant>,
}

fn stage_style(known_total: bool, width: usize) -> ProgressStyle {
    let template = if known_total {
        format!("{{prefix:<{width}}} [{{bar:30.cyan/blue}}] {{pos}}/{{len}}  {{msg}}")
    } else {
        format!("{{prefix:<{width}}} step {{pos}}  {{msg}}")
    };
    ProgressStyle::with_template(&template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

fn run_style() -> ProgressStyle {
    ProgressStyle::with_template("run [{bar:30.green/white}] {pos}/{len} stages finished{msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

fn label(stage: &str) -> String {
    if stage.chars().count() <= MAX_LABEL {
        stage.to_string()
    } else {
        let cut: String = stage.chars().take(MAX_LABEL - 1).collect();
        format!("{cut}…")
    }
}

/// A stage's bar message: loss, tokens/s, and its ETA from its pace so far.
pub fn stage_message(p: &Progress) -> String {
    let mut parts = Vec::new();
    if let Some(loss) = p.loss {
        parts.push(format!("loss {loss:.4}"));
    }
    if let Some(rate) = p.tokens_per_s {
        parts.push(format!("{} tok/s", human_rate(rate)));
    }
    match p.total {
        Some(total) if p.step > 0 && total > p.step => {
            let left = p.elapsed.as_secs_f64() / p.step as f64 * (total - p.step) as f64;
            parts.push(format!(
                "ETA {}",
                human_duration(Duration::from_secs_f64(left))
            ));
        }
        Some(total) if p.step >= total => parts.push("ETA 0s".into()),
        _ => parts.push(format!("{} elapsed", human_duration(p.elapsed))),
    }
    parts.join("  ")
}

impl Bars {
    /// Bars drawn on stderr (hidden by `indicatif` itself if stderr is not a terminal).
    pub fn new() -> Bars {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10));
        let run = multi.add(ProgressBar::new(0).with_style(run_style()));
        Bars {
            multi,
            state: Mutex::new(State {
                run,
                started: Instant::now(),
                total: 0,
                finished: 0,
                stages: HashMap::new(),
                label_width: 5,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run has `stages` stages.
    pub fn planned(&self, stages: usize) {
        let mut state = self.state();
        state.total = stages;
        state.run.set_length(stages as u64);
        state.update_run();
    }

    /// A stage attempt started: it gets a bar (while fewer than [`MAX_BARS`] have one).
    pub fn started(&self, stage: &str) {
        let mut state = self.state();
        let with_bar = state.stages.values().filter(|r| r.bar.is_some()).count() < MAX_BARS;
        let bar = with_bar.then(|| {
            let name = label(stage);
            if name.chars().count() > state.label_width {
                state.label_width = name.chars().count();
                let width = state.label_width;
                for r in state.stages.values() {
                    if let Some(bar) = &r.bar {
                        bar.set_style(stage_style(bar.length().is_some(), width));
                    }
                }
            }
            let bar = self
                .multi
                .add(ProgressBar::no_length().with_style(stage_style(false, state.label_width)));
            bar.set_prefix(name);
            bar.set_message("starting");
            bar
        });
        if let Some(old) = state.stages.insert(
            stage.to_string(),
            Running {
                bar,
                done: 0.0,
                ends: None,
            },
        ) {
            if let Some(bar) = old.bar {
                self.drop_bar(&bar);
            }
        }
        state.update_run();
    }

    /// A stage's progress: its bar's step, total and message.
    pub fn progress(&self, p: &Progress) {
        let mut state = self.state();
        let width = state.label_width;
        let Some(running) = state.stages.get_mut(&p.stage) else {
            return;
        };
        if let Some(total) = p.total.filter(|t| *t > 0) {
            running.done = (p.step as f64 / total as f64).min(1.0);
            if p.step > 0 {
                let left =
                    p.elapsed.as_secs_f64() / p.step as f64 * total.saturating_sub(p.step) as f64;
                running.ends = Some(Instant::now() + Duration::from_secs_f64(left));
            }
        }
        if let Some(bar) = &running.bar {
            if let Some(total) = p.total.filter(|t| *t > 0) {
                if bar.length() != Some(total) {
                    bar.set_style(stage_style(true, width));
                    bar.set_length(total);
                }
            }
            bar.set_position(p.step);
            bar.set_message(stage_message(p));
        }
        state.update_run();
    }

    /// A stage attempt ended (`counts`: it will not run again, so it counts as finished).
    pub fn finished(&self, stage: &str, counts: bool) {
        let mut state = self.state();
        if let Some(running) = state.stages.remove(stage) {
            if let Some(bar) = running.bar {
                self.drop_bar(&bar);
            }
        }
        if counts {
            state.finished += 1;
        }
        state.update_run();
    }

    /// A stage will not run: it counts as finished.
    pub fn skipped(&self) {
        let mut state = self.state();
        state.finished += 1;
        state.update_run();
    }

    fn drop_bar(&self, bar: &ProgressBar) {
        bar.finish_and_clear();
        self.multi.remove(bar);
    }

    /// Prints a line above the bars.
    pub fn println(&self, line: &str) {
        let _ = self.multi.println(line);
    }

    /// Runs `print` with the bars cleared (for blocks of text), then draws them again.
    pub fn suspend(&self, print: impl FnOnce()) {
        self.multi.suspend(print);
    }

    /// The run ended: every bar is cleared for good.
    pub fn end(&self) {
        let mut state = self.state();
        for (_, running) in state.stages.drain() {
            if let Some(bar) = running.bar {
                bar.finish_and_clear();
            }
        }
        state.run.finish_and_clear();
        let _ = self.multi.clear();
    }
}

impl Default for Bars {
    fn default() -> Bars {
        Bars::new()
    }
}

impl State {
    /// The run line: stages finished of all, and the run's ETA: with stages still to start,
    /// from the run's pace so far (running stages count by their fraction done); with none, when
    /// the last running stage is expected to end.
    fn update_run(&mut self) {
        let running = self.stages.len();
        let mut msg = format!(", {running} running");
        let waiting = self.total.saturating_sub(self.finished + running);
        let left = if waiting == 0 && running > 0 {
            let now = Instant::now();
            let ends = self.stages.values().map(|r| r.ends);
            ends.collect::<Option<Vec<Instant>>>()
                .and_then(|ends| ends.into_iter().max())
                .map(|end| end.saturating_duration_since(now).as_secs_f64())
        } else {
            let done = self.finished as f64 + self.stages.values().map(|r| r.done).sum::<f64>();
            let elapsed = self.started.elapsed().as_secs_f64();
            (done > 0.0 && waiting + running > 0)
                .then(|| elapsed / done * (self.total as f64 - done).max(0.0))
        };
        if let Some(left) = left {
            msg.push_str(&format!(
                ", ETA {}",
                human_duration(Duration::from_secs_f64(left))
            ));
        }
        self.run.set_message(msg);
        self.run.set_position(self.finished as u64);
    }
}

/// A rate with a k or M suffix (`12.3k`).
pub(crate) fn human_rate(rate: f64) -> String {
    if rate >= 1e6 {
        format!("{:.1}M", rate / 1e6)
    } else if rate >= 1e3 {
        format!("{:.1}k", rate / 1e3)
    } else {
        format!("{rate:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_message_has_its_loss_rate_and_eta_from_its_pace() {
        let p = Progress {
            stage: "train".into(),
            step: 25,
            total: Some(100),
            loss: Some(1.5),
            tokens_per_s: Some(12_345.0),
            elapsed: Duration::from_secs(10),
        };
        assert_eq!(stage_message(&p), "loss 1.5000  12.3k tok/s  ETA 30.0s");
    }
}
