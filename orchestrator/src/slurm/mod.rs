//! Slurm: being a good citizen of an allocation.
//!
//! - [`Allocation`] is the job this process runs in, read from the environment;
//! - [`choose_run_dir`] keeps a run directory that stays the same across requeues of a job,
//!   and resumes the run in it after a requeue;
//! - `stop` is the stop sequence: read why the job is stopping from Slurm's own job state
//!   (`jobstate`), journal it, and ask for the requeue;
//! - `srun` launches stages that set `nodes`/`tasks_per_node`/`gpus_per_task` as a job
//!   step, started by the launcher in [`launch`] (which turns the orchestrator's SIGTERM into
//!   SIGTERM for every process of the step, not srun's SIGKILL) through the per-task wrapper
//!   in `task` (both take the arguments `hidden_args` reads), and checks every node's GPUs
//!   after them (`node_check`); what the tasks and the check leave in the stage's directory
//!   is in `records`;
//! - [`placement`] spreads the stages of a run over every node of an allocation of several,
//!   each instance a job step of its own;
//! - `history` is the job's record in the run directory (`slurm.json`) and in the report;
//! - every helper program (`scontrol`, `squeue`, `srun`) is started through `helper`, which
//!   registers it with the orchestrator's reaper so its exit status is not lost.

pub(crate) mod drain;
pub(crate) mod helper;
pub(crate) mod hidden_args;
pub(crate) mod history;
pub(crate) mod jobstate;
pub mod launch;
pub mod lost;
pub(crate) mod node_check;
pub mod pacing;
pub mod placement;
pub(crate) mod records;
pub mod relay;
pub(crate) mod shared_dir;
pub(crate) mod srun;
pub(crate) mod step_tree;
pub(crate) mod stop;
pub(crate) mod task;

use std::path::{Path, PathBuf};

/// Why a plan or a run cannot go ahead in (or outside) this Slurm job; each message says
/// what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlurmError {
    /// A stage runs through srun, and this process is not in a Slurm allocation.
    #[error("stage `{stage}` runs {tasks} task(s) on {nodes} node(s) through srun, which needs a Slurm allocation, and this is not one (no SLURM_JOB_ID): submit the plan with `sbatch configs/slurm/pipeline.sbatch PLAN` (or run it inside `salloc`), or remove `nodes`/`tasks_per_node`/`gpus_per_task` from the stage")]
    NoAllocation {
        /// The stage.
        stage: String,
        /// Its tasks, on all nodes.
        tasks: u32,
        /// Its nodes.
        nodes: u32,
    },
    /// A stage asks for more nodes than the job has.
    #[error("stage `{stage}` asks for {nodes} nodes but Slurm job {job_id} has {job_nodes}: submit with `sbatch --nodes={nodes}`, or lower `nodes`")]
    TooFewNodes {
        /// The stage.
        stage: String,
        /// The nodes it asks for.
        nodes: u32,
        /// The job.
        job_id: String,
        /// The job's nodes.
        job_nodes: u32,
    },
    /// A run spread over the nodes of an allocation has a run directory some node cannot see.
    #[error("the run directory {dir} is not shared by every node of this allocation{}: {detail}. Stages placed on other nodes write their logs and outputs there: put it on a file system all nodes mount (pass --run-dir, or submit from such a directory)", not_seen_on(.nodes))]
    RunDirNotShared {
        /// The run directory.
        dir: PathBuf,
        /// The nodes that do not see it (empty when the check could not tell which).
        nodes: Vec<String>,
        /// What went wrong.
        detail: String,
    },
    /// A first start of the job finds its default run directory already holding a run.
    #[error("{dir} already holds a run, but this start of Slurm job {job_id} is not a requeue (SLURM_RESTART_COUNT is 0): the plan was run twice in one job, or the job id was reused. Move that directory away, or pass --run-dir")]
    RunDirHoldsRun {
        /// The run directory.
        dir: PathBuf,
        /// The job.
        job_id: String,
    },
}

/// ` (not seen on n2, n3)`, or nothing when no node is named.
fn not_seen_on(nodes: &[String]) -> String {
    if nodes.is_empty() {
        String::new()
    } else {
        format!(" (not seen on {})", nodes.join(", "))
    }
}

/// This machine's short host name (what Slurm calls the node), or "localhost".
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    name.split('.').next().unwrap_or("localhost").to_string()
}

/// The Slurm job this process runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// `SLURM_JOB_ID`.
    pub job_id: String,
    /// `SLURM_RESTART_COUNT`: how many times the job was requeued before this start (0 when
    /// unset: the first start).
    pub restart_count: u32,
    /// `SLURM_JOB_NUM_NODES` (1 when unset).
    pub num_nodes: u32,
    /// `SLURM_JOB_NODELIST`, as Slurm writes it (`node[01-04]`).
    pub nodelist: String,
    /// GPUs of the allocation on this node (`SLURM_GPUS_ON_NODE`, else the count in
    /// `SLURM_JOB_GPUS`), when Slurm says.
    pub gpus_on_node: Option<u32>,
    /// The node this process runs on (`SLURMD_NODENAME`, else the host name).
    pub host: String,
    /// The GPUs Slurm gave the job on this node, as device indices (`SLURM_JOB_GPUS`, else
    /// `SLURM_STEP_GPUS`), when it says.
    pub gpu_indices: Option<Vec<u32>>,
    /// The CPUs of the whole allocation (`SLURM_JOB_CPUS_PER_NODE`, summed), when Slurm says.
    pub total_cpus: Option<u32>,
}

impl Allocation {
    /// The job of this process, or `None` outside Slurm (no `SLURM_JOB_ID`).
    pub fn detect() -> Option<Allocation> {
        Allocation::from_vars(|k| std::env::var(k).ok())
    }

    /// The job described by these variables (`get` returns a variable's value), or `None`
    /// without a `SLURM_JOB_ID`.
    pub(crate) fn from_vars(get: impl Fn(&str) -> Option<String>) -> Option<Allocation> {
        let job_id = get("SLURM_JOB_ID")
            .or_else(|| get("SLURM_JOBID"))
            .filter(|v| !v.trim().is_empty())?
            .trim()
            .to_string();
        let number = |k: &str| get(k).and_then(|v| v.trim().parse::<u32>().ok());
        let gpus_on_node = number("SLURM_GPUS_ON_NODE").or_else(|| {
            get("SLURM_JOB_GPUS")
                .filter(|v| !v.trim().is_empty())
                .map(|v| v.split(',').count() as u32)
        });
        let gpu_indices = get("SLURM_JOB_GPUS")
            .or_else(|| get("SLURM_STEP_GPUS"))
            .filter(|v| !v.trim().is_empty())
            .map(|v| {
                v.split(',')
                    .filter_map(|i| i.trim().parse::<u32>().ok())
                    .collect::<Vec<u32>>()
            });
        Some(Allocation {
            gpu_indices,
            total_cpus: get("SLURM_JOB_CPUS_PER_NODE")
                .as_deref()
                .and_then(placement::total_cpus),
            job_id,
            restart_count: number("SLURM_RESTART_COUNT").unwrap_or(0),
            num_nodes: number("SLURM_JOB_NUM_NODES")
                .or_else(|| number("SLURM_NNODES"))
                .unwrap_or(1),
            nodelist: get("SLURM_JOB_NODELIST")
                .or_else(|| get("SLURM_NODELIST"))
                .unwrap_or_default(),
            gpus_on_node,
            host: get("SLURMD_NODENAME")
                .filter(|h| !h.is_empty())
                .unwrap_or_else(host_name),
        })
    }
}

impl Allocation {
    /// One line for the console: the job, which start this is, its nodes and GPUs.
    pub fn describe(&self) -> String {
        let start = if self.restart_count == 0 {
            "first start".to_string()
        } else {
            format!(
                "start {} (requeued {} time(s))",
                self.restart_count + 1,
                self.restart_count
            )
        };
        let gpus = match (&self.gpu_indices, self.gpus_on_node) {
            (Some(ids), _) => format!(
                "GPUs {} on this node",
                ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            ),
            (None, Some(n)) => format!("{n} GPU(s) on this node"),
            (None, None) => "no GPUs given by Slurm".to_string(),
        };
        format!(
            "Slurm job {}, {start}, on {} node(s) ({}) from {}; {gpus}",
            self.job_id, self.num_nodes, self.nodelist, self.host
        )
    }
}

/// The GPUs of this machine (as NVML lists them) that Slurm gave this job: those whose index
/// is in `SLURM_JOB_GPUS` (Slurm's device numbers, `/dev/nvidiaN`, which follow the PCI order
/// NVML's indices use). Where Slurm constrains the job's devices (cgroup `ConstrainDevices`)
/// NVML lists only the job's GPUs, numbered from 0: when it lists exactly as many as the job
/// was given and their indices are not all among the job's, that view is already the job's
/// and all of it is kept. Without that variable, or outside Slurm, all of them. A stage is
/// never handed a GPU another job on the node was given.
pub(crate) fn allowed_gpus(
    gpus: Vec<crate::gpu::GpuInfo>,
    job: Option<&Allocation>,
) -> (Vec<crate::gpu::GpuInfo>, Option<String>) {
    let Some(ids) = job.and_then(|j| j.gpu_indices.as_ref()) else {
        return (gpus, None);
    };
    let total = gpus.len();
    if total == ids.len() && !gpus.iter().all(|g| ids.contains(&g.index)) {
        return (gpus, None);
    }
    let kept: Vec<_> = gpus
        .into_iter()
        .filter(|g| ids.contains(&g.index))
        .collect();
    let note = (kept.len() != total).then(|| {
        format!(
            "Slurm gave this job GPU(s) {:?} of the {total} on this node: stages use only those",
            ids
        )
    });
    (kept, note)
}

/// Where a run goes inside a Slurm job, and whether it resumes the run already there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDirChoice {
    /// The run directory.
    pub dir: PathBuf,
    /// Continue the run in it (the job was requeued and the directory holds its run).
    pub resume: bool,
}

/// The default run directory of plan `name` in job `job_id`: `runs/<name>-slurm-<job id>`
/// under the current directory (the job's working directory), the same at every start of the
/// job.
pub(crate) fn default_run_dir(name: &str, job_id: &str) -> PathBuf {
    Path::new("runs").join(format!("{name}-slurm-{job_id}"))
}

/// Inside a Slurm job, the run directory (the explicit one, else `default_run_dir`) and
/// whether to resume: after a requeue (`SLURM_RESTART_COUNT` ≥ 1) the run already in that
/// directory is continued, so finished stages are not run again. `None` outside Slurm.
///
/// A first start (restart count 0) that finds the default directory already holding a run is
/// an error that says what to do: that is another run of the same plan in this job (or a job
/// id reused after the controller's state was reset), never this job's own.
pub fn choose_run_dir(
    job: Option<&Allocation>,
    explicit: Option<&Path>,
    resume_asked: bool,
    name: &str,
) -> Option<Result<RunDirChoice, SlurmError>> {
    let job = job?;
    let dir = explicit
        .map(Path::to_path_buf)
        .unwrap_or_else(|| default_run_dir(name, &job.job_id));
    let holds_run = dir.join("journal.jsonl").is_file();
    if resume_asked || (holds_run && job.restart_count > 0) {
        return Some(Ok(RunDirChoice { dir, resume: true }));
    }
    if holds_run && explicit.is_none() {
        return Some(Err(SlurmError::RunDirHoldsRun {
            dir,
            job_id: job.job_id.clone(),
        }));
    }
    Some(Ok(RunDirChoice { dir, resume: false }))
}

/// The signals that stop a run inside a Slurm job besides SIGINT and SIGTERM: SIGUSR1 and
/// SIGUSR2, whichever the job script declared with `#SBATCH --signal=B:SIG@SECONDS` (our
/// scripts use SIGUSR2). Outside Slurm nothing is listened to and they keep their default.
pub struct WarningSignals {
    streams: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl WarningSignals {
    /// Listens for SIGUSR1 and SIGUSR2 when `in_slurm`.
    pub fn listen(in_slurm: bool) -> std::io::Result<WarningSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        let streams = if in_slurm {
            Some((
                signal(SignalKind::user_defined1())?,
                signal(SignalKind::user_defined2())?,
            ))
        } else {
            None
        };
        Ok(WarningSignals { streams })
    }

    /// The next warning signal's name ("SIGUSR1", "SIGUSR2"); never resolves outside Slurm.
    pub async fn recv(&mut self) -> &'static str {
        match &mut self.streams {
            Some((usr1, usr2)) => tokio::select! {
                _ = usr1.recv() => "SIGUSR1",
                _ = usr2.recv() => "SIGUSR2",
            },
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn detects_a_job_from_its_variables() {
        assert_eq!(Allocation::from_vars(vars(&[])), None);
        assert_eq!(Allocation::from_vars(vars(&[("SLURM_JOB_ID", " ")])), None);
        let a = Allocation::from_vars(vars(&[
            ("SLURM_JOB_ID", "42"),
            ("SLURM_RESTART_COUNT", "2"),
            ("SLURM_JOB_NUM_NODES", "4"),
            ("SLURM_JOB_NODELIST", "gpu[01-04]"),
            ("SLURM_JOB_GPUS", "0,1,2,3"),
            ("SLURMD_NODENAME", "gpu01"),
        ]))
        .unwrap();
        assert_eq!(a.job_id, "42");
        assert_eq!(a.restart_count, 2);
        assert_eq!(a.num_nodes, 4);
        assert_eq!(a.nodelist, "gpu[01-04]");
        assert_eq!(a.gpus_on_node, Some(4));
        assert_eq!(a.gpu_indices, Some(vec![0, 1, 2, 3]));
        assert!(
            a.describe().contains("start 3 (requeued 2 time(s))"),
            "{}",
            a.describe()
        );
        assert_eq!(a.host, "gpu01");
        let first = Allocation::from_vars(vars(&[("SLURM_JOB_ID", "7")])).unwrap();
        assert_eq!((first.restart_count, first.num_nodes), (0, 1));
    }

    #[test]
    fn stages_get_only_the_gpus_slurm_gave_the_job() {
        let gpu = |index: u32| crate::gpu::GpuInfo {
            cuda_index: index,
            index,
            uuid: format!("GPU-{index}"),
            name: "H200".into(),
            total_bytes: 1,
        };
        let all: Vec<_> = (0..8).map(gpu).collect();
        let job = Allocation::from_vars(vars(&[("SLURM_JOB_ID", "1"), ("SLURM_JOB_GPUS", "2,5")]))
            .unwrap();
        let (kept, note) = allowed_gpus(all.clone(), Some(&job));
        assert_eq!(kept.iter().map(|g| g.index).collect::<Vec<_>>(), vec![2, 5]);
        assert!(note.unwrap().contains("of the 8"));
        let plain = Allocation::from_vars(vars(&[("SLURM_JOB_ID", "1")])).unwrap();
        assert_eq!(allowed_gpus(all.clone(), Some(&plain)).0.len(), 8);
        assert_eq!(allowed_gpus(all, None).0.len(), 8);
        // Devices constrained by Slurm's cgroup: NVML sees only the job's two, as 0 and 1.
        let constrained: Vec<_> = (0..2).map(gpu).collect();
        let (kept, note) = allowed_gpus(constrained, Some(&job));
        assert_eq!(kept.iter().map(|g| g.index).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(note, None);
    }

    #[test]
    fn the_run_directory_is_resumed_only_after_a_requeue() {
        let base = std::env::temp_dir().join(format!("slurm-rundir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dir = base.join("run");
        let mut job = Allocation::from_vars(vars(&[("SLURM_JOB_ID", "9")])).unwrap();
        assert_eq!(choose_run_dir(None, Some(&dir), false, "p"), None);
        let fresh = choose_run_dir(Some(&job), Some(&dir), false, "p").unwrap();
        assert_eq!(
            fresh,
            Ok(RunDirChoice {
                dir: dir.clone(),
                resume: false
            })
        );
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("journal.jsonl"), "").unwrap();
        job.restart_count = 1;
        let again = choose_run_dir(Some(&job), Some(&dir), false, "p").unwrap();
        assert_eq!(
            again,
            Ok(RunDirChoice {
                dir: dir.clone(),
                resume: true
            })
        );
        let default = choose_run_dir(Some(&job), None, false, "quick")
            .unwrap()
            .unwrap();
        assert_eq!(default.dir, Path::new("runs/quick-slurm-9"));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn refusals_say_what_to_do() {
        let taken = SlurmError::RunDirHoldsRun {
            dir: PathBuf::from("runs/p-slurm-9"),
            job_id: "9".into(),
        };
        assert_eq!(
            taken.to_string(),
            "runs/p-slurm-9 already holds a run, but this start of Slurm job 9 is not a requeue (SLURM_RESTART_COUNT is 0): the plan was run twice in one job, or the job id was reused. Move that directory away, or pass --run-dir"
        );
        let few = SlurmError::TooFewNodes {
            stage: "train".into(),
            nodes: 4,
            job_id: "9".into(),
            job_nodes: 2,
        };
        assert_eq!(
            few.to_string(),
            "stage `train` asks for 4 nodes but Slurm job 9 has 2: submit with `sbatch --nodes=4`, or lower `nodes`"
        );
        let outside = SlurmError::NoAllocation {
            stage: "train".into(),
            tasks: 8,
            nodes: 2,
        };
        assert!(outside
            .to_string()
            .starts_with("stage `train` runs 8 task(s) on 2 node(s) through srun, which needs a Slurm allocation"));
    }
}
