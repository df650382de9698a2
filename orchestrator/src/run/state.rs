//! Where each stage of a run stands, kept compactly: a sweep holds one `StageState` per
//! instance for the whole run (100,000 of them in a large one), so what a finished attempt
//! leaves for the report is a few fixed fields, and everything that is usually empty
//! (checkpoints, metrics, GPU records, leftovers, protocol violations, a stderr tail) sits
//! behind one pointer that is absent when it is all empty.

use crate::attempt::outcome::{AttemptResult, Outcome};
use crate::process::reaper::ExitStatus;
use crate::process::tree::StoppedProcess;
use protocol::report::{CheckpointRecord, GpuRecord, HostUsage, StageReport, StageTiming};
use protocol::status::FailureClass;
use protocol::status::StageStatus;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Where a stage is in this run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Status {
    /// Not started (or waiting for its upstream stages or GPUs).
    Pending,
    /// Failed; retried at this instant.
    RetryAt(Instant),
    /// An attempt is running.
    Running,
    /// Done, outputs verified.
    Succeeded,
    /// Failed after its retries.
    Failed,
    /// Will not run: the class of the reason (`upstream_failed`, `interrupted`, `fail_fast`,
    /// `gpu_leaked`, as the report's `failure`) and the reason, for the user.
    Skipped(FailureClass, String),
    /// Stopped by a cancel.
    Cancelled,
}

/// A stage's state in this run.
pub(crate) struct StageState {
    /// Where it is.
    pub(crate) status: Status,
    /// Attempts so far (earlier runs' included).
    pub(crate) attempts: u32,
    /// What the last attempt left for the report.
    pub(crate) last: Option<LastAttempt>,
    /// The last failure: class and message.
    pub(crate) failure: Option<Box<(FailureClass, String)>>,
}

impl StageState {
    /// A stage that has not run in this run (after `attempts` earlier attempts).
    pub(crate) const fn pending(attempts: u32) -> StageState {
        StageState {
            status: Status::Pending,
            attempts,
            last: None,
            failure: None,
        }
    }
}

/// What the report needs of a finished attempt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LastAttempt {
    /// The first process's exit status.
    pub(crate) exit: Option<ExitStatus>,
    /// Wall time from spawn to the last process gone.
    pub(crate) wall: Duration,
    /// Milestones (absent for an attempt that never started).
    pub(crate) timing: Option<StageTiming>,
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

/// The parts of an attempt's result that most stages of a sweep leave empty.
#[derive(Debug, Clone, PartialEq, Default)]
struct Details {
    checkpoints: Vec<CheckpointRecord>,
    metrics: BTreeMap<String, f64>,
    gpu: Vec<GpuRecord>,
    leftovers: Vec<StoppedProcess>,
    violations: Vec<String>,
    stderr_tail: Option<String>,
    start: Option<protocol::report::StageStart>,
    cgroup: Option<CgroupCounters>,
    started_early: bool,
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
    }
}

impl LastAttempt {
    /// Keeps what the report needs of `result`.
    pub(crate) fn of(result: AttemptResult) -> LastAttempt {
        let details = Details {
            checkpoints: result.checkpoints,
            metrics: result.metrics,
            gpu: result.gpu,
            leftovers: result.leftovers,
            violations: result.violations,
            stderr_tail: result.stderr_tail,
            start: result.start,
            cgroup: result.host.as_ref().and_then(CgroupCounters::of),
            started_early: result.started_early,
        };
        LastAttempt {
            exit: result.exit,
            wall: result.wall,
            timing: result.timing,
            host: result.host.map(|h| HostCore {
                cpu_user_s: h.cpu_user_s,
                cpu_system_s: h.cpu_system_s,
                peak_rss_bytes: h.peak_rss_bytes,
                isolation: h.isolation,
            }),
            details: (!details.is_empty()).then(|| Box::new(details)),
        }
    }

    /// A stage kept from an earlier run (resume): succeeded, with its outputs and metrics.
    pub(crate) fn kept(
        checkpoints: Vec<CheckpointRecord>,
        metrics: BTreeMap<String, f64>,
        wall: Duration,
    ) -> LastAttempt {
        LastAttempt::of(AttemptResult {
            outcome: Outcome::Succeeded,
            exit: Some(ExitStatus::Code(0)),
            wall,
            checkpoints,
            metrics,
            ..AttemptResult::early_failure(crate::attempt::outcome::Failure::Exit(0))
        })
    }

    /// Verified outputs.
    pub(crate) fn checkpoints(&self) -> &[CheckpointRecord] {
        self.details.as_deref().map_or(&[], |d| &d.checkpoints)
    }

    /// The last metrics reported.
    pub(crate) fn metrics(&self) -> Option<&BTreeMap<String, f64>> {
        self.details.as_deref().map(|d| &d.metrics)
    }

    /// Per-GPU verification.
    pub(crate) fn gpu(&self) -> &[GpuRecord] {
        self.details.as_deref().map_or(&[], |d| &d.gpu)
    }

    /// Processes that outlived the first process and had to be stopped.
    pub(crate) fn leftovers(&self) -> &[StoppedProcess] {
        self.details.as_deref().map_or(&[], |d| &d.leftovers)
    }

    /// Malformed messages received.
    pub(crate) fn violations(&self) -> &[String] {
        self.details.as_deref().map_or(&[], |d| &d.violations)
    }

    /// Last lines of stderr, when it failed.
    pub(crate) fn stderr_tail(&self) -> Option<&str> {
        self.details
            .as_deref()
            .and_then(|d| d.stderr_tail.as_deref())
    }

    /// CPU time and memory of the stage's processes, and its cgroup's counters.
    pub(crate) fn host(&self) -> Option<HostUsage> {
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

    /// Stages with `preload`: how the attempt's first process was started.
    pub(crate) fn start(&self) -> Option<&protocol::report::StageStart> {
        self.details.as_deref().and_then(|d| d.start.as_ref())
    }

    /// Whether it was started early (see [`AttemptResult::started_early`]).
    pub(crate) fn started_early(&self) -> bool {
        self.details.as_deref().is_some_and(|d| d.started_early)
    }
}

impl crate::report::StageFacts for Vec<StageState> {
    fn stage_report(&self, i: usize, name: &str, output_dir: String) -> StageReport {
        match self.get(i) {
            Some(state) => state.report(name, output_dir),
            None => crate::report::pending_stage(name, output_dir),
        }
    }
}

impl StageState {
    /// This stage's record for the report, named `name` with its outputs under `output_dir`
    /// (where it ran is the placement's to add).
    fn report(&self, name: &str, output_dir: String) -> StageReport {
        let last = self.last.as_ref();
        let failure = self.failure.as_deref();
        let (status, failure, error) = match &self.status {
            Status::Succeeded => (StageStatus::Succeeded, None, None),
            Status::Failed => (
                StageStatus::Failed,
                failure.map(|f| f.0),
                failure.map(|f| f.1.clone()),
            ),
            Status::Skipped(class, reason) => {
                (StageStatus::Skipped, Some(*class), Some(reason.clone()))
            }
            Status::Cancelled => (
                StageStatus::Cancelled,
                None,
                Some("stopped by a signal".to_string()),
            ),
            Status::Running => (StageStatus::Running, None, None),
            Status::Pending | Status::RetryAt(_) => (StageStatus::Pending, None, None),
        };
        StageReport {
            status,
            attempts: self.attempts,
            exit_code: last.and_then(|r| match r.exit {
                Some(ExitStatus::Code(c)) => Some(c),
                _ => None,
            }),
            signal: last.and_then(|r| match r.exit {
                Some(ExitStatus::Signal(s)) => Some(crate::process::tree::signal_name(s)),
                _ => None,
            }),
            error,
            failure,
            stderr_tail: last.and_then(|r| r.stderr_tail().map(String::from)),
            checkpoints: last.map(|r| r.checkpoints().to_vec()).unwrap_or_default(),
            wall_s: last.map(|r| r.wall.as_secs_f64()),
            metrics: last.and_then(|r| r.metrics().cloned()).unwrap_or_default(),
            gpu: last.map(|r| r.gpu().to_vec()).unwrap_or_default(),
            leftover_processes: last
                .map(|r| {
                    r.leftovers()
                        .iter()
                        .map(|p| format!("pid {} ({})", p.pid, p.name))
                        .collect()
                })
                .unwrap_or_default(),
            protocol_violations: last.map(|r| r.violations().to_vec()).unwrap_or_default(),
            timing: last.and_then(|r| r.timing),
            started_early: last.is_some_and(|r| r.started_early()),
            host: last.and_then(|r| r.host()),
            start: last.and_then(|r| r.start().cloned()),
            ..crate::report::pending_stage(name, output_dir)
        }
    }
}

impl crate::attempt::prepare::FinishedOutputs for &[StageState] {
    fn outputs_of(&self, stage: usize) -> &[CheckpointRecord] {
        self[stage]
            .last
            .as_ref()
            .map_or(&[], |last| last.checkpoints())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut result = AttemptResult::early_failure(crate::attempt::outcome::Failure::Exit(0));
        result.host = Some(usage);
        let last = LastAttempt::of(result.clone());
        assert_eq!(last.host(), Some(usage));
        let plain = HostUsage {
            memory_peak_bytes: None,
            memory_limit_bytes: None,
            oom_kills: None,
            ..usage
        };
        result.host = Some(plain);
        let last = LastAttempt::of(result);
        assert_eq!(last.host(), Some(plain));
        assert!(last.details.is_none(), "no counters, no details kept");
    }

    #[test]
    fn a_quiet_success_keeps_no_details_and_stays_small() {
        let mut result = AttemptResult::early_failure(crate::attempt::outcome::Failure::Exit(0));
        result.outcome = Outcome::Succeeded;
        result.exit = Some(ExitStatus::Code(0));
        let last = LastAttempt::of(result);
        assert!(last.details.is_none());
        assert!(last.checkpoints().is_empty() && last.metrics().is_none());
        // The per-stage budget of a 100,000-stage sweep (1 KiB in all) leaves this part little.
        assert!(std::mem::size_of::<StageState>() <= 160);
        let kept = LastAttempt::kept(
            Vec::new(),
            BTreeMap::from([("loss".into(), 1.0)]),
            Duration::ZERO,
        );
        assert_eq!(kept.metrics().unwrap()["loss"], 1.0);
    }
}
