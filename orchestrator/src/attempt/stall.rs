//! Hangs: a stage that stops making progress is judged `hung` within its stall window, with the
//! evidence saved before it is stopped.
//!
//! What counts as progress depends on what the stage shows:
//! - a stage that reports progress (the built-in worker, the Python helper, the Trainer and
//!   Lightning callbacks) makes progress when its step advances, or it sends metrics or a
//!   checkpoint; nothing else counts, however busy its processes look (a kernel spinning for
//!   ever keeps a GPU and a CPU at full use);
//! - a stage that has reported none makes progress when its processes use CPU time, or its
//!   logs or output directory grow;
//! - a stage that said its device work is over (`finishing`, `released`: it is persisting its
//!   checkpoint) is never judged hung.
//!
//! The window is the stage's `stall_timeout`, else the run's; by default 30 minutes, applied
//! only once a stage has reported progress (a stage that reports nothing may be waiting on
//! something orchestrate cannot see, a download say, unless the plan says otherwise).

use protocol::duration::StallTimeout;
use protocol::worker::WorkerEvent;
use std::path::Path;
use std::time::{Duration, Instant};

/// The window when neither the stage nor the run sets one, for stages that report progress.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30 * 60);

/// When an attempt is judged hung.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallRule {
    /// Never.
    Off,
    /// After this long without progress, once the stage has reported progress (the default).
    Reported(Duration),
    /// After this long without progress, whatever the stage reports (set in the plan).
    Always(Duration),
}

impl StallRule {
    /// The rule for a stage with `stage`'s setting in a run with `run`'s.
    pub fn of(stage: Option<StallTimeout>, run: Option<StallTimeout>) -> StallRule {
        match stage.or(run) {
            None => StallRule::Reported(DEFAULT_WINDOW),
            Some(StallTimeout::Off) => StallRule::Off,
            Some(StallTimeout::After(d)) => StallRule::Always(d.get()),
        }
    }

    /// How often a stage under this rule is looked at: a fifth of its window, between 1 s and
    /// 10 s. `None` when it is never judged.
    pub fn period(self) -> Option<Duration> {
        match self {
            StallRule::Off => None,
            StallRule::Reported(w) | StallRule::Always(w) => Some(
                (w / 5)
                    .max(Duration::from_secs(1))
                    .min(Duration::from_secs(10)),
            ),
        }
    }
}

/// What a stage without progress reports can show: its processes' CPU time, and the bytes of
/// its logs and outputs with their latest change.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Activity {
    pub cpu_s: f64,
    pub written: (u64, Option<std::time::SystemTime>),
}

/// One attempt's progress as far as a hang is concerned.
#[derive(Debug)]
pub struct StallWatch {
    rule: StallRule,
    last_progress: Instant,
    /// The stage has reported progress (a step, metrics or a checkpoint).
    reported: bool,
    last_step: Option<u64>,
    /// It said its device work is over: it persists what it made.
    persisting: bool,
    last_activity: Option<Activity>,
}

impl StallWatch {
    /// A watch for an attempt that started `now`.
    pub fn new(rule: StallRule, now: Instant) -> StallWatch {
        StallWatch {
            rule,
            last_progress: now,
            reported: false,
            last_step: None,
            persisting: false,
            last_activity: None,
        }
    }

    /// The last step the stage reported.
    pub fn last_step(&self) -> Option<u64> {
        self.last_step
    }

    /// Takes in one of the stage's events at `now`.
    pub fn event(&mut self, event: &WorkerEvent, now: Instant) {
        match event {
            WorkerEvent::Progress { step, .. } if self.last_step.is_none_or(|l| *step > l) => {
                self.last_step = Some(*step);
                self.advance(now);
            }
            WorkerEvent::Metrics { .. } | WorkerEvent::Checkpoint { .. } => self.advance(now),
            WorkerEvent::Finishing {} | WorkerEvent::Released { .. } => self.persisting = true,
            WorkerEvent::Started { .. } => self.last_progress = now,
            _ => {}
        }
    }

    fn advance(&mut self, now: Instant) {
        self.reported = true;
        self.last_progress = now;
    }

    /// Whether what the stage shows is worth sampling now: it is judged by it (it has
    /// reported no progress, under a rule that judges such stages).
    pub fn wants_activity(&self) -> bool {
        !self.reported && matches!(self.rule, StallRule::Always(_))
    }

    /// Takes in what the stage showed at `now`: any change is progress for a stage that reports
    /// none.
    pub fn activity(&mut self, seen: Activity, now: Instant) {
        if let Some(last) = self.last_activity {
            if seen.written != last.written || seen.cpu_s > last.cpu_s + 0.05 {
                self.last_progress = now;
            }
        }
        self.last_activity = Some(seen);
    }

    /// The window the stage has gone without progress, if it is hung at `now`.
    pub fn hung(&self, now: Instant) -> Option<Duration> {
        if self.persisting {
            return None;
        }
        let window = match self.rule {
            StallRule::Off => return None,
            StallRule::Reported(w) if self.reported => w,
            StallRule::Reported(_) => return None,
            StallRule::Always(w) => w,
        };
        (now.duration_since(self.last_progress) >= window).then_some(window)
    }
}

/// The bytes under `dirs` (recursively, at most 10,000 entries) and the latest change among
/// them: a stage's logs and outputs growing.
pub fn written(dirs: &[&Path]) -> (u64, Option<std::time::SystemTime>) {
    let mut bytes = 0;
    let mut latest = None;
    let mut stack: Vec<std::path::PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
    let mut budget = 10_000;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            budget -= 1;
            if budget == 0 {
                return (bytes, latest);
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                bytes += meta.len();
                latest = latest.max(meta.modified().ok());
            }
        }
    }
    (bytes, latest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(step: u64) -> WorkerEvent {
        serde_json::from_value(serde_json::json!({"event": "progress", "step": step})).unwrap()
    }

    #[test]
    fn a_reporting_stage_is_hung_when_its_step_stops_advancing_however_busy() {
        let t0 = Instant::now();
        let w = Duration::from_secs(10);
        let mut watch = StallWatch::new(StallRule::Always(w), t0);
        watch.event(&progress(1), t0 + Duration::from_secs(5));
        // The same step again is no progress; CPU time is not looked at for it.
        watch.event(&progress(1), t0 + Duration::from_secs(12));
        assert!(!watch.wants_activity());
        assert_eq!(watch.hung(t0 + Duration::from_secs(14)), None);
        assert_eq!(watch.hung(t0 + Duration::from_secs(15)), Some(w));
        assert_eq!(watch.last_step(), Some(1));
    }

    #[test]
    fn by_default_only_a_stage_that_reported_progress_is_judged() {
        let t0 = Instant::now();
        let mut watch = StallWatch::new(StallRule::of(None, None), t0);
        let later = t0 + DEFAULT_WINDOW * 2;
        assert_eq!(watch.hung(later), None, "a silent stage is not judged");
        watch.event(&progress(3), t0);
        assert_eq!(watch.hung(later), Some(DEFAULT_WINDOW));
        assert_eq!(StallRule::of(Some(StallTimeout::Off), None), StallRule::Off);
    }

    #[test]
    fn a_silent_stage_is_judged_by_its_cpu_and_its_writing_and_a_persisting_one_never() {
        let t0 = Instant::now();
        let w = Duration::from_secs(10);
        let mut watch = StallWatch::new(StallRule::Always(w), t0);
        assert!(watch.wants_activity());
        let s = Duration::from_secs;
        watch.activity(Activity::default(), t0 + s(1));
        watch.activity(
            Activity {
                cpu_s: 3.0,
                ..Default::default()
            },
            t0 + s(8),
        );
        assert_eq!(watch.hung(t0 + s(17)), None, "CPU time used at 8 s");
        watch.activity(
            Activity {
                cpu_s: 3.0,
                ..Default::default()
            },
            t0 + s(17),
        );
        assert_eq!(watch.hung(t0 + s(18)), Some(w));
        watch.event(
            &serde_json::from_value(serde_json::json!({"event": "finishing"})).unwrap(),
            t0 + s(18),
        );
        assert_eq!(watch.hung(t0 + s(100)), None);
    }
}
