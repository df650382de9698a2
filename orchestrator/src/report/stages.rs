//! The report's record of every stage, kept from the run's events: [`ReportSink`] reads each
//! stage's start, end and skip ([`RunEvent`]) and keeps what `report.json` shows of it, so the
//! report needs nothing of how the run keeps its own state.
//!
//! Kept compactly: a sweep holds one [`StageRecord`] per instance for the whole run (100,000
//! of them in a large one), so what a finished attempt leaves is a few fixed fields, and
//! everything that is usually empty (checkpoints, metrics, GPU records, leftovers, protocol
//! violations, a stderr tail) sits behind one pointer that is absent when it is all empty.

use super::StageFacts;
use crate::events::{AttemptFacts, RunEvent, Sink, StageEnd};
use crate::plan::LoadedPlan;
use protocol::report::{CheckpointRecord, GpuRecord, HostUsage, StageReport, StageTiming};
use protocol::status::{FailureClass, StageStatus};
use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Where a stage stands, as the report shows it.
#[derive(Debug, Clone, PartialEq)]
enum Stands {
    /// Not started, or to run again (a retry, a void early start).
    Pending,
    /// An attempt is running.
    Running,
    /// Done, outputs verified.
    Succeeded,
    /// Failed after its retries: the class of the failure and its message.
    Failed(Option<FailureClass>, Option<String>),
    /// Will not run: the class of the reason and the reason.
    Skipped(FailureClass, String),
    /// Stopped by a cancel.
    Cancelled,
}

/// What the report knows of one stage.
#[derive(Debug, Clone, PartialEq)]
pub struct StageRecord {
    stands: Stands,
    /// Attempts so far (earlier runs' included).
    attempts: u32,
    /// What its last attempt that ran left.
    last: Option<LastAttempt>,
}

impl StageRecord {
    /// A stage that has not run in this run (after `attempts` earlier attempts).
    pub fn pending(attempts: u32) -> StageRecord {
        StageRecord {
            stands: Stands::Pending,
            attempts,
            last: None,
        }
    }

    /// A stage kept from an earlier run (resume): succeeded after `attempts` attempts, with
    /// its outputs, metrics and wall time.
    pub fn kept(
        attempts: u32,
        checkpoints: Vec<CheckpointRecord>,
        metrics: BTreeMap<String, f64>,
        wall: Duration,
    ) -> StageRecord {
        let facts = AttemptFacts {
            exit_code: Some(0),
            ..AttemptFacts::default()
        };
        let details = Details {
            checkpoints,
            metrics,
            ..Details::default()
        };
        StageRecord {
            stands: Stands::Succeeded,
            attempts,
            last: Some(LastAttempt::new(wall, &facts, details)),
        }
    }

    /// Takes in an attempt's end: where the stage stands now, and what the attempt left (an
    /// attempt that never ran leaves the last one that did in place).
    fn ended(&mut self, end: &StageEnd) {
        self.attempts = end.attempt;
        self.stands = match end.status {
            _ if end.runs_again => Stands::Pending,
            StageStatus::Succeeded => Stands::Succeeded,
            StageStatus::Failed => Stands::Failed(end.failure, end.error.clone()),
            StageStatus::Cancelled => Stands::Cancelled,
            StageStatus::Running => Stands::Running,
            _ => Stands::Pending,
        };
        if let Some(last) = LastAttempt::of(end) {
            self.last = Some(last);
        }
    }

    /// This stage's record for the report, named `name` with its outputs under `output_dir`
    /// (where it ran is the placement's to add).
    fn report(&self, name: &str, output_dir: String) -> StageReport {
        let last = self.last.as_ref();
        let (status, failure, error) = match &self.stands {
            Stands::Succeeded => (StageStatus::Succeeded, None, None),
            Stands::Failed(class, error) => (StageStatus::Failed, *class, error.clone()),
            Stands::Skipped(class, reason) => {
                (StageStatus::Skipped, Some(*class), Some(reason.clone()))
            }
            Stands::Cancelled => (
                StageStatus::Cancelled,
                None,
                Some("stopped by a signal".to_string()),
            ),
            Stands::Running => (StageStatus::Running, None, None),
            Stands::Pending => (StageStatus::Pending, None, None),
        };
        let details = last.and_then(|r| r.details.as_deref());
        StageReport {
            status,
            attempts: self.attempts,
            exit_code: last.and_then(|r| r.exit_code),
            signal: details.and_then(|d| d.signal.clone()),
            error,
            failure,
            stderr_tail: details.and_then(|d| d.stderr_tail.clone()),
            checkpoints: last.map(|r| r.checkpoints().to_vec()).unwrap_or_default(),
            wall_s: last.map(|r| r.wall.as_secs_f64()),
            metrics: details.map(|d| d.metrics.clone()).unwrap_or_default(),
            gpu: details.map(|d| d.gpu.clone()).unwrap_or_default(),
            leftover_processes: details.map(|d| d.leftovers.clone()).unwrap_or_default(),
            protocol_violations: details.map(|d| d.violations.clone()).unwrap_or_default(),
            timing: last.and_then(|r| r.timing),
            started_early: details.is_some_and(|d| d.started_early),
            host: last.and_then(|r| r.host()),
            start: details.and_then(|d| d.start.clone()),
            ..super::pending_stage(name, output_dir)
        }
    }
}

/// What the report needs of a finished attempt.
#[derive(Debug, Clone, PartialEq)]
struct LastAttempt {
    /// The first process's exit code, if it exited.
    exit_code: Option<i32>,
    /// Wall time from spawn to the last process gone.
    wall: Duration,
    /// Milestones (absent for an attempt that never started).
    timing: Option<StageTiming>,
    /// CPU time and memory of the stage's processes (its cgroup's counters are in `details`:
    /// most stages have none, and a sweep keeps one of these per stage).
    host: Option<HostCore>,
    /// The rest, absent when all of it is empty.
    details: Option<Box<Details>>,
}

/// What every attempt has of [`HostUsage`].
#[derive(Debug, Clone, Copy, PartialEq)]
struct HostCore {
    cpu_user_s: f64,
    cpu_system_s: f64,
    peak_rss_bytes: u64,
    isolation: Option<protocol::report::Isolation>,
}

/// What an attempt in a cgroup with limits has of [`HostUsage`] beyond [`HostCore`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct CgroupCounters {
    memory_peak_bytes: Option<u64>,
    memory_limit_bytes: Option<u64>,
    oom_kills: Option<u64>,
    pids_refused: Option<u64>,
}

impl CgroupCounters {
    fn of(host: &HostUsage) -> Option<CgroupCounters> {
        let counters = CgroupCounters {
            memory_peak_bytes: host.memory_peak_bytes,
            memory_limit_bytes: host.memory_limit_bytes,
            oom_kills: host.oom_kills,
            pids_refused: host.pids_refused,
        };
        (counters != CgroupCounters::default()).then_some(counters)
    }
}

/// The parts of an attempt's end that most stages of a sweep leave empty.
#[derive(Debug, Clone, PartialEq, Default)]
struct Details {
    checkpoints: Vec<CheckpointRecord>,
    metrics: BTreeMap<String, f64>,
    gpu: Vec<GpuRecord>,
    leftovers: Vec<String>,
    violations: Vec<String>,
    stderr_tail: Option<String>,
    start: Option<protocol::report::StageStart>,
    cgroup: Option<CgroupCounters>,
    started_early: bool,
    signal: Option<String>,
}

impl Details {
    fn is_empty(&self) -> bool {
        self.checkpoints.is_empty()
            && self.metrics.is_empty()
            && self.gpu.is_empty()
            && self.leftovers.is_empty()
            && self.violations.is_empty()
            && self.stderr_tail.is_none()
            && self.start.is_none()
            && self.cgroup.is_none()
            && !self.started_early
            && self.signal.is_none()
    }
}

impl LastAttempt {
    /// What the report keeps of an attempt's end; `None` when it never ran.
    fn of(end: &StageEnd) -> Option<LastAttempt> {
        let wall = end.wall?;
        let none = AttemptFacts::default();
        let facts = end.facts.as_deref().unwrap_or(&none);
        let details = Details {
            checkpoints: end.checkpoints.clone(),
            metrics: end.metrics.clone(),
            stderr_tail: end.stderr_tail.clone(),
            ..Details::default()
        };
        Some(LastAttempt::new(wall, facts, details))
    }

    /// An attempt of `wall` that left `facts`, beyond its outputs, metrics and stderr
    /// (`details`).
    fn new(wall: Duration, facts: &AttemptFacts, details: Details) -> LastAttempt {
        let details = Details {
            gpu: facts.gpu.clone(),
            leftovers: facts.leftover_processes.clone(),
            violations: facts.protocol_violations.clone(),
            start: facts.start.clone(),
            cgroup: facts.host.as_ref().and_then(CgroupCounters::of),
            started_early: facts.started_early,
            signal: facts.signal.clone(),
            ..details
        };
        LastAttempt {
            exit_code: facts.exit_code,
            wall,
            timing: facts.timing,
            host: facts.host.map(|h| HostCore {
                cpu_user_s: h.cpu_user_s,
                cpu_system_s: h.cpu_system_s,
                peak_rss_bytes: h.peak_rss_bytes,
                isolation: h.isolation,
            }),
            details: (!details.is_empty()).then(|| Box::new(details)),
        }
    }

    /// Verified outputs.
    fn checkpoints(&self) -> &[CheckpointRecord] {
        self.details.as_deref().map_or(&[], |d| &d.checkpoints)
    }

    /// CPU time and memory of the stage's processes, and its cgroup's counters.
    fn host(&self) -> Option<HostUsage> {
        let core = self.host?;
        let counters = self
            .details
            .as_deref()
            .and_then(|d| d.cgroup)
            .unwrap_or_default();
        Some(HostUsage {
            cpu_user_s: core.cpu_user_s,
            cpu_system_s: core.cpu_system_s,
            peak_rss_bytes: core.peak_rss_bytes,
            isolation: core.isolation,
            memory_peak_bytes: counters.memory_peak_bytes,
            memory_limit_bytes: counters.memory_limit_bytes,
            oom_kills: counters.oom_kills,
            pids_refused: counters.pids_refused,
        })
    }
}

/// Every stage's record, by plan index.
#[derive(Debug)]
pub struct StageRecords {
    plan: Arc<LoadedPlan>,
    stages: Vec<StageRecord>,
    /// The plan index of the stage last named by an event: the next event is most often about
    /// it or the stage after it (a chain's end, then its successor's start).
    recent: usize,
}

impl StageRecords {
    /// The record of the stage named `name`, if the plan has it. The stage last named and the
    /// one after it are tried first: a sweep's events come in plan order, and the look-up by
    /// name (a binary search over names scattered in memory) is a sweep's cost per event
    /// (`bench/overhead` has the profile).
    fn named(&mut self, name: &str) -> Option<&mut StageRecord> {
        let stages = &self.plan.plan.stages;
        let near = [self.recent, self.recent + 1];
        let i = match near
            .into_iter()
            .find(|&k| stages.get(k).is_some_and(|s| s.name == name))
        {
            Some(k) => k,
            None => self.plan.index_of(name)?,
        };
        self.recent = i;
        self.stages.get_mut(i)
    }

    /// Takes in one event (only a stage's start, end and skip change a record).
    fn take(&mut self, event: &RunEvent) {
        match event {
            RunEvent::StageStarted { stage, attempt, .. } => {
                if let Some(record) = self.named(stage) {
                    record.stands = Stands::Running;
                    record.attempts = *attempt;
                }
            }
            RunEvent::StageFinished(end) => {
                if let Some(record) = self.named(&end.stage) {
                    record.ended(end);
                }
            }
            RunEvent::StageSkipped {
                stage,
                class,
                reason,
            } => {
                if let Some(record) = self.named(stage) {
                    record.stands = Stands::Skipped(*class, reason.clone());
                }
            }
            _ => {}
        }
    }

    /// Stage `i`'s verified outputs, as its last attempt that ran left them (none before).
    pub fn checkpoints(&self, i: usize) -> &[CheckpointRecord] {
        self.stages
            .get(i)
            .and_then(|s| s.last.as_ref())
            .map_or(&[], |last| last.checkpoints())
    }
}

impl StageFacts for StageRecords {
    fn stage_report(&self, i: usize, name: &str, output_dir: String) -> StageReport {
        match self.stages.get(i) {
            Some(record) => record.report(name, output_dir),
            None => super::pending_stage(name, output_dir),
        }
    }
}

/// The run's stage records, shared by its [`ReportSink`] (which keeps them) and the run loop
/// (which writes the report from them when it chooses).
#[derive(Debug, Clone)]
pub struct StageBook(Arc<Mutex<StageRecords>>);

impl StageBook {
    /// The records of `plan`'s stages, standing as `stages` (by plan index) as the run begins.
    pub fn new(plan: Arc<LoadedPlan>, stages: Vec<StageRecord>) -> StageBook {
        StageBook(Arc::new(Mutex::new(StageRecords {
            plan,
            stages,
            recent: 0,
        })))
    }

    /// The sink that keeps the records from the run's events.
    pub fn sink(&self) -> ReportSink {
        ReportSink(self.clone())
    }

    /// The records as they stand. Promise kept by the caller: no stage's start, end or skip is
    /// emitted while the guard is held (the sink would wait for it forever).
    pub fn read(&self) -> MutexGuard<'_, StageRecords> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Keeps the report's stage records from the run's events (see the module's doc).
#[derive(Debug)]
pub struct ReportSink(StageBook);

impl Sink for ReportSink {
    fn accept(&self, event: &RunEvent) -> io::Result<()> {
        if matches!(
            event,
            RunEvent::StageStarted { .. }
                | RunEvent::StageFinished(_)
                | RunEvent::StageSkipped { .. }
        ) {
            self.0.read().take(event);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Events;
    use crate::plan::parse_plan_toml;
    use std::path::Path;

    fn plan() -> Arc<LoadedPlan> {
        let text = "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n\
                    [[stage]]\nname = \"b\"\ncommand = [\"true\"]\nafter = [\"a\"]\n";
        Arc::new(parse_plan_toml(text, "t.toml", Path::new("/")).unwrap())
    }

    fn end(status: StageStatus, attempt: u32, facts: Option<AttemptFacts>) -> StageEnd {
        StageEnd {
            stage: "a".into(),
            attempt,
            status,
            error: (status != StageStatus::Succeeded).then(|| "exit code 3".into()),
            failure: (status == StageStatus::Failed).then_some(FailureClass::ExitCode),
            runs_again: false,
            lost_on: None,
            retry_in: None,
            wall: facts.as_ref().map(|_| Duration::from_secs(2)),
            plan_hash: "h".into(),
            checkpoints: Vec::new(),
            metrics: BTreeMap::from([("loss".into(), 0.5)]),
            stderr_tail: None,
            facts: facts.map(Box::new),
        }
    }

    fn report_of(book: &StageBook, i: usize) -> StageReport {
        book.read().stage_report(i, "a", "/out".into())
    }

    #[test]
    fn the_report_follows_a_stage_through_its_start_retry_and_final_failure() {
        let book = StageBook::new(plan(), vec![StageRecord::pending(0); 2]);
        let events = Events::new().with(book.sink());
        let started = |attempt| RunEvent::StageStarted {
            stage: "a".into(),
            attempt,
            pid: 1,
            placement: "cpu".into(),
            gpus: Vec::new(),
            plan_hash: "h".into(),
        };
        events.emit(started(1)).unwrap();
        assert_eq!(report_of(&book, 0).status, StageStatus::Running);
        let facts = AttemptFacts {
            exit_code: Some(3),
            leftover_processes: vec!["pid 7 (sleep)".into()],
            ..AttemptFacts::default()
        };
        let mut retried = end(StageStatus::Failed, 1, Some(facts.clone()));
        retried.runs_again = true;
        events
            .emit(RunEvent::StageFinished(Box::new(retried)))
            .unwrap();
        let r = report_of(&book, 0);
        assert_eq!(
            (r.status, r.attempts, r.error),
            (StageStatus::Pending, 1, None)
        );
        assert_eq!(r.exit_code, Some(3));
        events.emit(started(2)).unwrap();
        let last = end(StageStatus::Failed, 2, Some(facts));
        events
            .emit(RunEvent::StageFinished(Box::new(last)))
            .unwrap();
        let r = report_of(&book, 0);
        assert_eq!(r.status, StageStatus::Failed);
        assert_eq!(r.attempts, 2);
        assert_eq!(r.failure, Some(FailureClass::ExitCode));
        assert_eq!(r.error.as_deref(), Some("exit code 3"));
        assert_eq!(r.leftover_processes, vec!["pid 7 (sleep)".to_string()]);
        assert_eq!(r.metrics["loss"], 0.5);
        assert_eq!(r.wall_s, Some(2.0));
        // An end that never ran (it could not be prepared) leaves the last attempt's facts.
        let never = end(StageStatus::Failed, 3, None);
        events
            .emit(RunEvent::StageFinished(Box::new(never)))
            .unwrap();
        let r = report_of(&book, 0);
        assert_eq!((r.attempts, r.exit_code, r.wall_s), (3, Some(3), Some(2.0)));
        events
            .emit(RunEvent::StageSkipped {
                stage: "b".into(),
                class: FailureClass::UpstreamFailed,
                reason: "upstream stage `a` did not succeed".into(),
            })
            .unwrap();
        let b = book.read().stage_report(1, "b", "/out".into());
        assert_eq!(b.status, StageStatus::Skipped);
        assert_eq!(b.failure, Some(FailureClass::UpstreamFailed));
    }

    #[test]
    fn host_usage_comes_back_whole_its_cgroup_counters_kept_only_where_there_are_some() {
        let usage = HostUsage {
            cpu_user_s: 1.5,
            cpu_system_s: 0.25,
            peak_rss_bytes: 3 << 20,
            isolation: Some(protocol::report::Isolation::Cgroup),
            memory_peak_bytes: Some(256 << 20),
            memory_limit_bytes: Some(256 << 20),
            oom_kills: Some(1),
            pids_refused: None,
        };
        let mut facts = AttemptFacts {
            host: Some(usage),
            ..AttemptFacts::default()
        };
        let last = LastAttempt::new(Duration::ZERO, &facts, Details::default());
        assert_eq!(last.host(), Some(usage));
        let plain = HostUsage {
            memory_peak_bytes: None,
            memory_limit_bytes: None,
            oom_kills: None,
            ..usage
        };
        facts.host = Some(plain);
        let last = LastAttempt::new(Duration::ZERO, &facts, Details::default());
        assert_eq!(last.host(), Some(plain));
        assert!(last.details.is_none(), "no counters, no details kept");
    }

    #[test]
    fn a_quiet_success_keeps_no_details_and_stays_small() {
        let facts = AttemptFacts {
            exit_code: Some(0),
            ..AttemptFacts::default()
        };
        let mut quiet = end(StageStatus::Succeeded, 1, Some(facts));
        quiet.metrics.clear();
        let last = LastAttempt::of(&quiet).unwrap();
        assert!(last.details.is_none());
        assert!(last.checkpoints().is_empty());
        // The per-stage budget of a 100,000-stage sweep (1 KiB in all) leaves this part little.
        assert!(std::mem::size_of::<StageRecord>() <= 160);
        let kept = StageRecord::kept(
            1,
            Vec::new(),
            BTreeMap::from([("loss".into(), 1.0)]),
            Duration::ZERO,
        );
        let r = kept.report("a", "/out".into());
        assert_eq!((r.status, r.exit_code), (StageStatus::Succeeded, Some(0)));
        assert_eq!(r.metrics["loss"], 1.0);
    }
}
