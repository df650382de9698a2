//! Spreading a run over every node of a Slurm allocation.
//!
//! Inside an allocation of several nodes, every stage instance that does not ask for an srun
//! layout of its own runs as a one-task job step (`srun --exact --nodes=1 --ntasks=1`), so
//! Slurm places it on whichever node of the allocation has room, and the instances of a sweep
//! spread over all of them. The step goes through the same launcher and per-task wrapper as
//! an srun stage (`super::launch`, `super::task`): the wrapper runs the stage's command in a
//! session of its own on the node, kills and reaps what is left of its process group when it
//! ends, records the node and the exit in the stage's task records, and — because the step is
//! that one instance alone — checks the node's GPUs itself before it exits (`gpu-check
//! --json`, "unavailable" without NVML). The command's stdout and stderr are the step's, and
//! srun writes them to the stage's log files on the batch node.
//!
//! How many steps run at once is bounded by the CPUs of the allocation (one per instance) and
//! by `max_parallel`: the run never has srun wait for room, which srun does by asking the
//! controller again and again. Outside Slurm, and in an allocation of one node, nothing
//! changes: stages run as children of the orchestrator.

use super::Allocation;

/// Whether stages are placed as job steps over the nodes of `job`: inside an allocation of
/// more than one node.
pub fn spreads(job: Option<&Allocation>) -> bool {
    job.is_some_and(|j| j.num_nodes > 1)
}

/// The CPUs of an allocation from `SLURM_JOB_CPUS_PER_NODE` (`4(x3)`, `8,4(x2)`): their sum,
/// or `None` when the value is not in that form.
pub fn total_cpus(cpus_per_node: &str) -> Option<u32> {
    let mut total: u32 = 0;
    for part in cpus_per_node.split(',') {
        let part = part.trim();
        let (count, times) = match part.split_once('(') {
            Some((count, rest)) => {
                let times = rest.strip_prefix('x')?.strip_suffix(')')?;
                (count, times.parse::<u32>().ok()?)
            }
            None => (part, 1),
        };
        total = total.checked_add(count.parse::<u32>().ok()?.checked_mul(times)?)?;
    }
    (total > 0).then_some(total)
}

/// How many placed steps may run at once in `job`: one per CPU of the allocation, when Slurm
/// says how many it holds, else one per node. `None` where stages are not placed.
pub fn step_capacity(job: Option<&Allocation>) -> Option<usize> {
    let job = job.filter(|j| spreads(Some(j)))?;
    Some(job.total_cpus.unwrap_or(job.num_nodes).max(1) as usize)
}

/// How many stages a run holds at once: `max_parallel` (else one per core of this host), and
/// where stages are placed over an allocation never more than [`step_capacity`] — by default
/// that capacity itself, not this node's cores.
pub fn bound_parallel(max_parallel: Option<usize>, job: Option<&Allocation>) -> usize {
    let cores = || std::thread::available_parallelism().map_or(1, |n| n.get());
    match (max_parallel, step_capacity(job)) {
        (Some(n), Some(cap)) => n.min(cap),
        (None, Some(cap)) => cap,
        (Some(n), None) => n,
        (None, None) => cores(),
    }
}

/// The srun options of one placed instance: one task on one node, only the CPU (and the GPUs)
/// it asks for, so that the other instances' steps run beside it.
pub fn step_args(gpus: u32) -> Vec<String> {
    let mut args = vec![
        "--exact".to_string(),
        "--nodes=1".into(),
        "--ntasks=1".into(),
        "--cpus-per-task=1".into(),
    ];
    if gpus > 0 {
        args.push(format!("--gpus-per-task={gpus}"));
    }
    args
}

/// The srun options of an attempt of the placed instance whose stage directory is
/// `stage_dir` in `job`: [`step_args`], and on a retry `--exclude=` of the nodes the instance
/// was lost on in this allocation (never all of them: [`super::lost::exclude_arg`]).
pub fn attempt_args(gpus: u32, stage_dir: &std::path::Path, job: &Allocation) -> Vec<String> {
    let mut args = step_args(gpus);
    let key = super::lost::job_key(&job.job_id, job.restart_count);
    let lost = super::lost::nodes_lost_in(stage_dir, &key);
    args.extend(super::lost::exclude_arg(&lost, job.num_nodes, 1));
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(nodes: u32, cpus: Option<u32>) -> Allocation {
        let mut a = Allocation::from_vars(|k| (k == "SLURM_JOB_ID").then(|| "5".to_string()))
            .expect("a job");
        a.num_nodes = nodes;
        a.total_cpus = cpus;
        a
    }

    #[test]
    fn cpus_of_an_allocation_from_slurms_notation() {
        assert_eq!(total_cpus("4(x3)"), Some(12));
        assert_eq!(total_cpus("8,4(x2)"), Some(16));
        assert_eq!(total_cpus("2"), Some(2));
        assert_eq!(total_cpus(""), None);
        assert_eq!(total_cpus("4(y3)"), None);
        assert_eq!(total_cpus("four"), None);
    }

    #[test]
    fn only_an_allocation_of_several_nodes_places_steps() {
        assert!(!spreads(None));
        assert!(!spreads(Some(&job(1, Some(8)))));
        assert!(spreads(Some(&job(3, Some(12)))));
        assert_eq!(step_capacity(None), None);
        assert_eq!(step_capacity(Some(&job(1, Some(8)))), None);
        assert_eq!(step_capacity(Some(&job(3, Some(12)))), Some(12));
        assert_eq!(step_capacity(Some(&job(3, None))), Some(3));
        let three = job(3, Some(12));
        assert_eq!(bound_parallel(Some(4), Some(&three)), 4);
        assert_eq!(bound_parallel(Some(64), Some(&three)), 12);
        assert_eq!(bound_parallel(None, Some(&three)), 12);
        assert_eq!(bound_parallel(Some(64), None), 64);
        assert_eq!(bound_parallel(Some(64), Some(&job(1, Some(2)))), 64);
    }

    #[test]
    fn a_placed_step_asks_for_one_task_and_its_gpus() {
        assert_eq!(
            step_args(0),
            ["--exact", "--nodes=1", "--ntasks=1", "--cpus-per-task=1"]
        );
        assert_eq!(step_args(2).last().unwrap(), "--gpus-per-task=2");
    }

    #[test]
    fn a_retry_is_placed_off_the_nodes_its_instance_was_lost_on() {
        let dir = e2e_tests::Scratch::new("placement-exclude");
        let three = job(3, Some(12));
        let lost = |attempt: u32, node: &str| protocol::report::LostAttempt {
            attempt,
            node: node.into(),
            step: format!("5.{attempt}"),
        };
        let first = attempt_args(0, &dir, &three);
        assert_eq!(first, step_args(0), "a first attempt excludes nothing");
        let key = crate::slurm::lost::job_key("5", 0);
        crate::slurm::lost::record(&dir, &key, lost(1, "n3")).unwrap();
        assert_eq!(
            attempt_args(1, &dir, &three),
            [
                "--exact",
                "--nodes=1",
                "--ntasks=1",
                "--cpus-per-task=1",
                "--gpus-per-task=1",
                "--exclude=n3"
            ]
        );
        crate::slurm::lost::record(&dir, &key, lost(2, "n1")).unwrap();
        assert_eq!(
            attempt_args(0, &dir, &three).last().unwrap(),
            "--exclude=n3,n1"
        );
        crate::slurm::lost::record(&dir, &key, lost(3, "n2")).unwrap();
        assert_eq!(
            attempt_args(0, &dir, &three).last().unwrap(),
            "--exclude=n1,n2",
            "never every node of the allocation"
        );
        let mut requeued = three.clone();
        requeued.restart_count = 1;
        assert_eq!(
            attempt_args(0, &dir, &requeued),
            step_args(0),
            "losses of an earlier start of the job exclude nothing"
        );
    }
}
