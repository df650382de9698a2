//! Stages that set `nodes`, `tasks_per_node` or `gpus_per_task` run as a job step of the
//! allocation: `srun` starts the per-task wrapper ([`super::task`]) on every task, which
//! starts the stage's command with the torch.distributed environment.
//!
//! The rest of the stage's life is the same as for any stage: the launcher in front of `srun`
//! is the stage's first process, the output goes to the stage's logs (each line prefixed with
//! its rank, `--label`), a stop (SIGTERM) reaches every task's program as SIGTERM with the
//! stage's grace period to act on it, and the stage succeeds when `srun` exits 0 (every task
//! exited 0) with the declared outputs present.

use super::hidden_args::{orchestrate_exe, ENV_PLACED, LAUNCH_SUBCOMMAND, TASK_SUBCOMMAND};
use super::Allocation;
use protocol::plan::{Stage, TaskLayout};
use std::path::Path;

/// The `srun` options that place `layout` on the allocation.
pub fn layout_args(layout: TaskLayout) -> Vec<String> {
    let mut args = vec![
        format!("--nodes={}", layout.nodes),
        format!("--ntasks={}", layout.world_size()),
        format!("--ntasks-per-node={}", layout.tasks_per_node),
    ];
    if let Some(g) = layout.gpus_per_task {
        args.push(format!("--gpus-per-task={g}"));
    }
    args
}

/// The srun options of an attempt of the stage whose layout is `layout` and whose directory
/// is `stage_dir`, in `job`: [`layout_args`] (with `--exact` beside placed steps, in an
/// allocation of several nodes), and on a retry `--exclude=` of the nodes an attempt was lost
/// on in this allocation while enough are left for the step ([`super::lost::exclude_arg`]).
pub fn layout_attempt_args(layout: TaskLayout, stage_dir: &Path, job: &Allocation) -> Vec<String> {
    let exact = super::placement::spreads(Some(job)).then(|| "--exact".to_string());
    let mut args: Vec<String> = exact.into_iter().chain(layout_args(layout)).collect();
    let key = super::lost::job_key(&job.job_id, job.restart_count);
    let lost = super::lost::nodes_lost_in(stage_dir, &key);
    args.extend(super::lost::exclude_arg(&lost, job.num_nodes, layout.nodes));
    args
}

/// The job step an attempt runs as: the command line in front of the stage's own (the
/// launcher, `srun` and its options, the per-task wrapper), and what the attempt adds to its
/// environment. Slurm asks the launcher alone to stop (srun kills the step's tasks when it gets
/// SIGTERM), so the attempt's graceful stop goes to its first process only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Goes before the stage's command line.
    pub prefix: Vec<String>,
    /// Added to the stage's environment.
    pub env: Vec<(String, String)>,
}

/// The job step of attempt `attempt` of `stage` (its directory `stage_dir`) inside `job`: an
/// `srun` job step for a stage with an srun layout, and in an allocation of several nodes for
/// every other stage a one-task step Slurm places on a node with room ([`super::placement`]);
/// `None` for a stage that runs as a child of the orchestrator. Clears the task records of
/// earlier attempts.
pub fn step(
    stage: &Stage,
    attempt: u32,
    stage_dir: &Path,
    job: Option<&Allocation>,
) -> Option<Step> {
    let mut env = vec![(super::lost::ENV_ATTEMPT.to_string(), attempt.to_string())];
    let placement = match (stage.task_layout(), job) {
        (Some(layout), Some(job)) => layout_attempt_args(layout, stage_dir, job),
        (None, Some(job)) if super::placement::spreads(Some(job)) => {
            env.insert(0, (ENV_PLACED.to_string(), "1".to_string()));
            super::placement::attempt_args(stage.gpus_wanted(), stage_dir, job)
        }
        _ => return None,
    };
    let records = super::records::records_dir(stage_dir);
    let _ = std::fs::remove_dir_all(&records);
    let _ = std::fs::create_dir_all(&records);
    let mut prefix = vec![
        orchestrate_exe(),
        LAUNCH_SUBCOMMAND.into(),
        "--records".into(),
        records.display().to_string(),
        "--".into(),
        "srun".to_string(),
        format!("--job-name={}", stage.name),
        "--kill-on-bad-exit=1".into(),
    ];
    // Each line prefixed with its rank, where there are ranks (a placed step is one task).
    if stage.task_layout().is_some() {
        prefix.push("--label".into());
    }
    prefix.extend(placement);
    prefix.extend([
        orchestrate_exe(),
        TASK_SUBCOMMAND.into(),
        "--records".into(),
        records.display().to_string(),
        "--".into(),
    ]);
    // `MASTER_PORT` is the attempt's own already (crate::attempt::rendezvous), as for every stage.
    Some(Step { prefix, env })
}

/// Refuses, with what to do, a plan whose srun stages cannot run here: outside a Slurm
/// allocation, or asking for more nodes than the allocation has.
pub fn check_plan(stages: &[Stage], job: Option<&Allocation>) -> Result<(), super::SlurmError> {
    for stage in stages {
        let Some(layout) = stage.task_layout() else {
            continue;
        };
        match job {
            None => {
                return Err(super::SlurmError::NoAllocation {
                    stage: stage.name.clone(),
                    tasks: layout.world_size(),
                    nodes: layout.nodes,
                })
            }
            Some(job) if layout.nodes > job.num_nodes => {
                return Err(super::SlurmError::TooFewNodes {
                    stage: stage.name.clone(),
                    nodes: layout.nodes,
                    job_id: job.job_id.clone(),
                    job_nodes: job.num_nodes,
                })
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_node_retry_keeps_off_the_node_it_was_lost_on_while_enough_are_left() {
        let dir = e2e_tests::Scratch::new("srun-exclude");
        let mut job = Allocation::from_vars(|k| (k == "SLURM_JOB_ID").then(|| "9".to_string()))
            .expect("a job");
        job.num_nodes = 3;
        let layout = TaskLayout {
            nodes: 2,
            tasks_per_node: 1,
            gpus_per_task: None,
        };
        let first = layout_attempt_args(layout, &dir, &job);
        assert!(
            !first.iter().any(|a| a.starts_with("--exclude")),
            "{first:?}"
        );
        let lost = |attempt, node: &str| protocol::report::LostAttempt {
            attempt,
            node: node.into(),
            step: format!("9.{attempt}"),
        };
        super::super::lost::record(&dir, "9+0", lost(1, "n2")).unwrap();
        let retry = layout_attempt_args(layout, &dir, &job);
        assert!(
            retry.contains(&"--exclude=n2".to_string()),
            "{retry}",
            retry = retry.join(" ")
        );
        assert!(retry.contains(&"--nodes=2".to_string()));
        // Two nodes lost of three: one is kept off, the step still has its two.
        super::super::lost::record(&dir, "9+0", lost(2, "n3")).unwrap();
        let again = layout_attempt_args(layout, &dir, &job);
        assert!(again.contains(&"--exclude=n3".to_string()), "{again:?}");
    }

    #[test]
    fn layout_becomes_srun_options() {
        let layout = TaskLayout {
            nodes: 2,
            tasks_per_node: 4,
            gpus_per_task: Some(1),
        };
        assert_eq!(
            layout_args(layout),
            [
                "--nodes=2",
                "--ntasks=8",
                "--ntasks-per-node=4",
                "--gpus-per-task=1"
            ]
        );
    }
}
