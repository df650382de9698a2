//! Where a run's stages ran, as the report shows it: the Slurm job the run is part of and what
//! each stage's job steps left (its tasks, the GPU check of its nodes, the attempts lost with a
//! node). The report does not read those itself: the run's placement (`crate::run::placement`)
//! gives them as [`Placed`], and outside Slurm there is nothing ([`NotPlaced`]).

use protocol::plan::Stage;
use protocol::report::{
    LostAttempt, NodeGpuCheck, Report, SlurmJobReport, StageReport, TaskRecord,
};
use std::path::Path;

/// What a stage's job steps left for its record; empty for a stage that ran as a child of the
/// orchestrator.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageRecords {
    /// How each task of its last attempt ended, by rank.
    pub tasks: Vec<TaskRecord>,
    /// The GPU check of each node of its last attempt.
    pub nodes: Vec<NodeGpuCheck>,
    /// Its attempts lost with their node.
    pub lost: Vec<LostAttempt>,
}

/// The facts of where stages ran that a report holds. Shared with the thread that writes the
/// run's first report, hence `Sync`.
pub trait Placed: Sync {
    /// The Slurm job's record, when the run is inside one.
    fn job(&self) -> Option<SlurmJobReport>;
    /// What `stage`'s job steps left (its directory is `stage_dir`).
    fn stage(&self, stage: &Stage, stage_dir: &Path) -> StageRecords;
}

/// A run outside Slurm: no job, and every stage a child of the orchestrator.
pub struct NotPlaced;

impl Placed for NotPlaced {
    fn job(&self) -> Option<SlurmJobReport> {
        None
    }

    fn stage(&self, _: &Stage, _: &Path) -> StageRecords {
        StageRecords::default()
    }
}

/// An srun stage's lines of the summary: its tasks' ends and its nodes' GPU checks.
pub fn stage_lines(s: &StageReport) -> String {
    let mut out = String::new();
    let tasks: Vec<String> = s
        .tasks
        .iter()
        .map(|t| {
            let how = match (&t.signal, t.exit_code) {
                (Some(sig), _) => sig.clone(),
                (None, Some(c)) => format!("exit {c}"),
                (None, None) => "?".into(),
            };
            format!("rank {} on {}: {how}", t.rank, t.node)
        })
        .collect();
    if !tasks.is_empty() {
        out.push_str(&format!("{}: tasks: {}\n", s.name, tasks.join(", ")));
    }
    for n in &s.nodes {
        out.push_str(&format!(
            "{}: GPU check of node {}: {} ({})\n",
            s.name, n.node, n.verdict, n.detail
        ));
    }
    out
}

/// Lines for the end-of-run summary about the job: its starts, stops and requeues (the
/// report's stages are not read; see [`stage_lines`] for those). Empty outside Slurm.
pub fn job_lines(report: &Report) -> String {
    let mut out = String::new();
    if let Some(job) = &report.slurm {
        out.push_str(&format!(
            "Slurm job {}: {} start(s), {} requeue(s) so far\n",
            job.job_id,
            job.starts.len(),
            job.restart_count
        ));
        for stop in &job.stops {
            out.push_str(&format!(
                "  start {} stopped by {}: {}; requeue: {}\n",
                stop.restart_count + 1,
                stop.signal,
                stop.cause,
                stop.requeue
            ));
        }
    }
    out
}

/// The Slurm job's record as the journal has it (its starts and stops), for a report rebuilt
/// from the journal; `None` for a run that never ran inside Slurm. The journal does not say
/// when a start or a stop was: their `at` is 0.
pub fn job_from_journal(records: &[protocol::journal::JournalRecord]) -> Option<SlurmJobReport> {
    use protocol::journal::JournalRecord;
    use protocol::report::{SlurmStart, SlurmStop};
    let mut job: Option<SlurmJobReport> = None;
    for record in records {
        match record {
            JournalRecord::SlurmStarted {
                job_id,
                restart_count,
                host,
                nodelist,
            } => {
                let j = job.get_or_insert_with(|| SlurmJobReport {
                    job_id: job_id.clone(),
                    nodelist: nodelist.clone(),
                    restart_count: *restart_count,
                    starts: Vec::new(),
                    stops: Vec::new(),
                });
                j.restart_count = *restart_count;
                j.nodelist = nodelist.clone();
                j.starts.push(SlurmStart {
                    at: 0.0,
                    restart_count: *restart_count,
                    host: host.clone(),
                });
            }
            JournalRecord::SlurmStopped {
                restart_count,
                signal,
                cause,
                job_state,
                requeue,
                ..
            } => {
                if let Some(j) = &mut job {
                    j.stops.push(SlurmStop {
                        at: 0.0,
                        restart_count: *restart_count,
                        signal: signal.clone(),
                        cause: cause.clone(),
                        job_state: job_state.clone(),
                        requeue: requeue.clone(),
                    });
                }
            }
            _ => {}
        }
    }
    job
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::journal::JournalRecord;

    #[test]
    fn the_job_is_rebuilt_from_its_journaled_starts_and_stops() {
        assert_eq!(job_from_journal(&[]), None, "never inside Slurm");
        let started = |restart_count| JournalRecord::SlurmStarted {
            job_id: "41".into(),
            restart_count,
            host: "n1".into(),
            nodelist: "n[1-2]".into(),
        };
        let stopped = JournalRecord::SlurmStopped {
            job_id: "41".into(),
            restart_count: 0,
            signal: "SIGTERM".into(),
            cause: "preemption".into(),
            job_state: "JobState=RUNNING".into(),
            requeue: "requested".into(),
        };
        let job = job_from_journal(&[started(0), stopped, started(1)]).expect("a job");
        assert_eq!(job.job_id, "41");
        assert_eq!(job.restart_count, 1);
        assert_eq!(job.starts.len(), 2);
        assert_eq!(job.stops.len(), 1);
        assert_eq!(job.stops[0].cause, "preemption");
        assert!(job_lines(&Report {
            v: protocol::PROTOCOL_VERSION,
            run_dir: "/r".into(),
            status: protocol::status::RunStatus::Requeued,
            gpu_check: "off".into(),
            wall_s: 0.0,
            stages: Vec::new(),
            slurm: Some(job),
        })
        .contains("Slurm job 41: 2 start(s), 1 requeue(s) so far"));
    }
}
