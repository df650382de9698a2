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
use crate::attempt::launch::AttemptPlan;
use protocol::plan::{Stage, TaskLayout};

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
pub fn layout_attempt_args(
    layout: TaskLayout,
    stage_dir: &std::path::Path,
    job: &Allocation,
) -> Vec<String> {
    let exact = super::placement::spreads(Some(job)).then(|| "--exact".to_string());
    let mut args: Vec<String> = exact.into_iter().chain(layout_args(layout)).collect();
    let key = super::lost::job_key(&job.job_id, job.restart_count);
    let lost = super::lost::nodes_lost_in(stage_dir, &key);
    args.extend(super::lost::exclude_arg(&lost, job.num_nodes, layout.nodes));
    args
}

/// Turns the attempt of a stage with an srun layout into an `srun` job step, and in an
/// allocation of several nodes every other stage's into a one-task step Slurm places on a
/// node with room ([`super::placement`]); other stages come back unchanged. Clears the task
/// records of earlier attempts.
pub fn wrap_attempt(mut plan: AttemptPlan, stage: &Stage, job: Option<&Allocation>) -> AttemptPlan {
    let placement = match (stage.task_layout(), job) {
        (Some(layout), Some(job)) => {
            plan.env
                .push((super::lost::ENV_ATTEMPT.into(), plan.attempt.to_string()));
            layout_attempt_args(layout, &plan.stage_dir, job)
        }
        (None, Some(job)) if super::placement::spreads(Some(job)) => {
            plan.env.push((ENV_PLACED.into(), "1".into()));
            plan.env
                .push((super::lost::ENV_ATTEMPT.into(), plan.attempt.to_string()));
            super::placement::attempt_args(stage.gpus_wanted(), &plan.stage_dir, job)
        }
        _ => return plan,
    };
    let records = super::records::records_dir(&plan.stage_dir);
    let _ = std::fs::remove_dir_all(&records);
    let _ = std::fs::create_dir_all(&records);
    let mut argv = vec![
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
        argv.push("--label".into());
    }
    argv.extend(placement);
    argv.extend([
        orchestrate_exe(),
        TASK_SUBCOMMAND.into(),
        "--records".into(),
        records.display().to_string(),
        "--".into(),
    ]);
    argv.append(&mut plan.argv);
    plan.argv = argv;
    // srun kills the step's tasks when it gets SIGTERM: only the launcher gets it.
    plan.graceful_to_leader = true;
    // `MASTER_PORT` is the attempt's own already (crate::attempt::rendezvous), as for every stage.
    plan
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
