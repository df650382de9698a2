//! Where a run's stages run, as the run loop asks it: [`Placement`] is the one value that
//! knows whether the run is inside a Slurm allocation and what follows from that, so the loop
//! has no Slurm branches of its own (the mechanics are in `crate::slurm`).
//!
//! - [`Placement::Local`]: outside Slurm, every stage is a child of the orchestrator;
//! - [`Placement::Allocation`]: inside an allocation of one node, stages run here too, except
//!   those with an srun layout (`nodes`, `tasks_per_node`, `gpus_per_task`), which run as a job
//!   step and have every node's GPUs checked after them;
//! - [`Placement::Spread`]: inside an allocation of several nodes, every stage is a job step
//!   Slurm places on a node with room, started at a paced rate, at most as many at once as the
//!   allocation has CPUs.
//!
//! Promises: a stage whose processes or GPUs may be on another node is never started early,
//! never hands over to its successor and never has its GPUs checked by this node's NVML;
//! only a run inside Slurm waits for a late stop signal and asks Slurm for a requeue.

use super::scheduler::Stopping;
use crate::attempt::launch::AttemptPlan;
use crate::attempt::outcome::{AttemptResult, Outcome};
use crate::error::{Error, Result};
use crate::events::journal::SharedJournal;
use crate::events::Events;
use crate::process::reaper::Reaper;
use crate::report::placed::{Placed, StageRecords};
use crate::settings::Settings;
use crate::slurm::node_check::NodeCheck;
use crate::slurm::pacing::TokenBucket;
use crate::slurm::stop::StopVerdict;
use crate::slurm::Allocation;
use protocol::plan::Stage;
use protocol::report::SlurmJobReport;
use std::path::{Path, PathBuf};

/// Where a run's stages run (see the module's documentation).
#[derive(Debug, Clone)]
pub(crate) enum Placement {
    /// Outside Slurm; `run_dir` is the run's directory, `resumes_slurm` whether earlier
    /// attempts of this run ran inside Slurm (its directory has the job's record), the only
    /// case in which a local run's report has Slurm records to show.
    Local {
        run_dir: PathBuf,
        resumes_slurm: bool,
    },
    /// Inside a Slurm allocation of one node.
    Allocation(InJob),
    /// Inside a Slurm allocation of several nodes.
    Spread(InJob),
}

/// A run inside a Slurm allocation.
#[derive(Debug, Clone)]
pub(crate) struct InJob {
    job: Allocation,
    /// The run's directory.
    run_dir: PathBuf,
    /// The `--max-used-mib` of the GPU check of an srun stage's nodes, if given.
    node_check_mib: Option<String>,
}

impl Placement {
    /// The placement of a run in `run_dir` inside `job` (`None`: outside Slurm), with the
    /// switches of `settings`.
    pub(crate) fn new(job: Option<Allocation>, run_dir: &Path, settings: &Settings) -> Placement {
        let run_dir = run_dir.to_path_buf();
        let Some(job) = job else {
            let resumes_slurm = crate::slurm::history::exists(&run_dir);
            return Placement::Local {
                run_dir,
                resumes_slurm,
            };
        };
        let spreads = crate::slurm::placement::spreads(Some(&job));
        let in_job = InJob {
            job,
            run_dir,
            node_check_mib: settings.node_check_max_used_mib.clone(),
        };
        match spreads {
            true => Placement::Spread(in_job),
            false => Placement::Allocation(in_job),
        }
    }

    fn in_job(&self) -> Option<&InJob> {
        match self {
            Placement::Local { .. } => None,
            Placement::Allocation(in_job) | Placement::Spread(in_job) => Some(in_job),
        }
    }

    /// The Slurm allocation the run is inside, if any.
    pub(crate) fn allocation(&self) -> Option<&Allocation> {
        self.in_job().map(|j| &j.job)
    }

    fn spreads(&self) -> bool {
        matches!(self, Placement::Spread(_))
    }

    /// How many stages the run holds at once, `asked` (`max_parallel`) bounded by what the
    /// placement can hold (`crate::slurm::placement::bound_parallel`).
    pub(crate) fn max_parallel(&self, asked: Option<usize>) -> usize {
        crate::slurm::placement::bound_parallel(asked, self.allocation())
    }

    /// Whether a stage may start before its upstream stages succeeded: only where every stage
    /// runs on this node, outside Slurm.
    pub(crate) fn allows_early_start(&self) -> bool {
        matches!(self, Placement::Local { .. })
    }

    /// The pace of fresh starts: spread over an allocation every start is a job step, few
    /// enough a second to keep the controller's load low. `None`: unpaced.
    pub(crate) fn start_pacing(&self) -> Option<TokenBucket> {
        self.spreads().then(TokenBucket::for_steps)
    }

    /// Whether stage `stage` runs as an srun job step of its own layout (its successor is
    /// never prepared ahead for a hand-over).
    pub(crate) fn runs_srun_layout(&self, stage: &Stage) -> bool {
        self.allocation().is_some() && stage.task_layout().is_some()
    }

    /// The attempt as it is started here: unchanged on this node, else a job step (the
    /// launcher and srun in front of its command; its graceful stop to the launcher alone).
    pub(crate) fn place(&self, mut plan: AttemptPlan, stage: &Stage) -> AttemptPlan {
        let step =
            crate::slurm::srun::step(stage, plan.attempt, &plan.stage_dir, self.allocation());
        let Some(step) = step else {
            return plan;
        };
        plan.env.extend(step.env);
        let mut argv = step.prefix;
        argv.append(&mut plan.argv);
        plan.argv = argv;
        // srun kills the step's tasks when it gets SIGTERM: only the launcher gets it.
        plan.graceful_to_leader = true;
        plan
    }

    /// What is due after an attempt of `stage` (its directory `stage_dir`) ended: the GPU
    /// check of every node of an srun stage.
    pub(crate) fn after_attempt(&self, stage: &Stage, stage_dir: &Path) -> AfterAttempt {
        let limit = self.in_job().and_then(|j| j.node_check_mib.as_deref());
        AfterAttempt(NodeCheck::for_stage(
            stage,
            self.allocation(),
            stage_dir,
            limit,
        ))
    }

    /// Whether an attempt's processes and GPUs are on this node, where NVML sees them and a
    /// successor can take over its slot.
    pub(crate) fn on_this_node(&self, after: &AfterAttempt) -> bool {
        after.0.is_none() && !self.spreads()
    }

    /// The node attempt `attempt` of the stage whose directory is `stage_dir` was lost with,
    /// if it was.
    pub(crate) fn lost_on(&self, stage_dir: &Path, attempt: u32) -> Option<String> {
        self.allocation()?;
        crate::slurm::lost::node_of_attempt(stage_dir, attempt)
    }

    /// Says where the run is, records this start of the job in the run directory and the
    /// journal, and, spread over several nodes, checks that every node sees the run directory.
    pub(crate) async fn begin(
        &self,
        journal: &SharedJournal,
        console: &Events,
        reaper: &Reaper,
    ) -> Result<()> {
        let Some(InJob { job, run_dir, .. }) = self.in_job() else {
            return Ok(());
        };
        console.note(&job.describe());
        journal.with(|j| crate::slurm::history::record_start(run_dir, job, j))?;
        // Placed steps write into the run directory from every node: all must see it.
        if self.spreads() {
            crate::slurm::shared_dir::check(run_dir, job, reaper)
                .await
                .map_err(|e| Error::from(super::preflight::Refusal::from(e)))?;
        }
        Ok(())
    }

    /// Whether the run waits a moment for a stop signal after its last stage ended: inside
    /// Slurm, `scancel` and the time limit signal every process of the job at once, so the stop
    /// can arrive with the last stage's end (not once the run is already interrupted).
    pub(crate) fn waits_for_late_stop(&self, stopping: Option<Stopping>) -> bool {
        self.allocation().is_some() && stopping != Some(Stopping::Interrupted)
    }

    /// After a run interrupted by `stop` (a signal, and when): inside Slurm, why the job
    /// stopped, journaled, the requeue asked for, and the run's status and exit code (told on
    /// `console`); `None` outside Slurm. Must run on the reaper's thread.
    pub(crate) async fn after_stop(
        &self,
        stop: super::StopBy,
        reaper: &Reaper,
        journal: &SharedJournal,
        console: &Events,
    ) -> Option<StopVerdict> {
        let InJob { job, run_dir, .. } = self.in_job()?;
        let verdict =
            crate::slurm::stop::after_stop(job, stop.signal, stop.at, reaper, journal, run_dir)
                .await;
        match verdict.status {
            protocol::status::RunStatus::Requeued => console.note(&verdict.message),
            _ => console.warn(&verdict.message),
        }
        if let Some(why) = &verdict.unrecorded {
            console.warn(why);
        }
        Some(verdict)
    }
}

/// What earlier starts left counts too: a run directory resumed outside the allocation it
/// began in still shows its job and its stages' tasks.
impl Placed for Placement {
    fn job(&self) -> Option<SlurmJobReport> {
        let run_dir = match self {
            Placement::Local {
                resumes_slurm: false,
                ..
            } => return None,
            Placement::Local { run_dir, .. } => run_dir,
            Placement::Allocation(j) | Placement::Spread(j) => &j.run_dir,
        };
        crate::slurm::history::load(run_dir)
    }

    /// Outside Slurm, nothing is looked up (every pass over the report would otherwise cost
    /// each stage's files a few system calls), unless the run resumes one that ran inside it.
    fn stage(&self, stage: &Stage, stage_dir: &Path) -> StageRecords {
        if let Placement::Local {
            resumes_slurm: false,
            ..
        } = self
        {
            return StageRecords::default();
        }
        let (tasks, nodes) = crate::slurm::records::stage_records(stage, stage_dir);
        StageRecords {
            tasks,
            nodes,
            lost: crate::slurm::lost::load(stage_dir),
        }
    }
}

/// What is due after an attempt ended, on the reaper's thread (see
/// [`Placement::after_attempt`]).
pub(crate) struct AfterAttempt(Option<NodeCheck>);

impl AfterAttempt {
    /// Runs it after the attempt that ended as `result` (not after one stopped by a signal:
    /// the job is on its way out).
    pub(crate) async fn run(self, result: &AttemptResult, reaper: &Reaper) {
        if let Some(check) = self.0 {
            if result.outcome != Outcome::Cancelled {
                check.run(reaper).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::parse_plan_toml;

    /// Stage 0 runs anywhere; stage 1 asks for an srun layout of its own.
    fn stages() -> Vec<Stage> {
        let text = "[[stage]]\nname = \"plain\"\ncommand = [\"true\"]\n\n\
                    [[stage]]\nname = \"wide\"\ncommand = [\"true\"]\nnodes = 1\ntasks_per_node = 2\n";
        let plan = parse_plan_toml(text, "t.toml", Path::new("/")).unwrap();
        plan.plan.stages
    }

    fn placement(nodes: Option<u32>) -> Placement {
        let job = nodes.map(|n| {
            let mut job = Allocation::from_vars(|k| (k == "SLURM_JOB_ID").then(|| "7".into()))
                .expect("a job");
            job.num_nodes = n;
            job.total_cpus = Some(4 * n);
            job
        });
        let settings = Settings::from_vars(|k| {
            (k == crate::settings::NODE_CHECK_MAX_USED_MIB).then(|| "64".into())
        });
        Placement::new(job, Path::new("/run"), &settings)
    }

    #[test]
    fn outside_slurm_every_stage_runs_here_and_may_start_early() {
        let (local, stages) = (placement(None), stages());
        assert!(local.allocation().is_none());
        assert!(local.allows_early_start());
        assert!(local.start_pacing().is_none());
        assert!(!local.runs_srun_layout(&stages[1]));
        assert!(!local.waits_for_late_stop(None));
        for stage in &stages {
            let after = local.after_attempt(stage, Path::new("/run/stages/x"));
            assert!(local.on_this_node(&after), "{}", stage.name);
        }
    }

    #[test]
    fn one_node_of_an_allocation_runs_srun_stages_as_steps_and_the_rest_here() {
        let (one, stages) = (placement(Some(1)), stages());
        assert!(matches!(one, Placement::Allocation(_)));
        assert!(!one.allows_early_start(), "never early inside Slurm");
        assert!(one.start_pacing().is_none());
        assert!(one.waits_for_late_stop(None));
        assert!(!one.waits_for_late_stop(Some(Stopping::Interrupted)));
        assert!(!one.runs_srun_layout(&stages[0]) && one.runs_srun_layout(&stages[1]));
        let plain = one.after_attempt(&stages[0], Path::new("/run/stages/plain"));
        assert!(one.on_this_node(&plain));
        let wide = one.after_attempt(&stages[1], Path::new("/run/stages/wide"));
        assert!(
            !one.on_this_node(&wide),
            "an srun stage's GPUs are checked per node"
        );
        assert_eq!(wide.0.expect("a node check").max_used_mib(), Some("64"));
    }

    #[test]
    fn several_nodes_place_every_stage_as_a_paced_step_bounded_by_the_cpus() {
        let (three, stages) = (placement(Some(3)), stages());
        assert!(matches!(three, Placement::Spread(_)));
        assert!(!three.allows_early_start());
        assert!(three.start_pacing().is_some());
        assert_eq!(three.max_parallel(Some(64)), 12);
        assert_eq!(three.max_parallel(Some(5)), 5);
        let plain = three.after_attempt(&stages[0], Path::new("/run/stages/plain"));
        assert!(
            !three.on_this_node(&plain),
            "a placed step may run on another node"
        );
    }
}
