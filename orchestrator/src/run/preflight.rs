//! Preflight: whether a plan can run on this host at all, checked before anything of the run
//! exists. The CLI runs it before the run starts; the daemon before it accepts a plan, so an
//! impossible plan is refused in the answer to `submit`, not accepted and then failed.

use crate::gpu::{GpuInfo, MemoryProbe};
use crate::host::Host;
use crate::plan::LoadedPlan;
use crate::process::cgroup::host::HostCgroups;
use crate::slurm::{Allocation, SlurmError};
use protocol::plan::GpuCheck;
use std::rc::Rc;

/// Why a plan cannot run on this host.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A stage run through `srun` outside a Slurm allocation, or one the allocation cannot
    /// hold.
    #[error(transparent)]
    Slurm(#[from] SlurmError),
    /// `gpu_check = "required"` but NVML cannot be used.
    #[error("the plan sets gpu_check = \"required\" but {why}; run on a machine with an NVIDIA driver, or set gpu_check = \"auto\"")]
    GpuCheckUnavailable {
        /// Why NVML cannot be used.
        why: String,
    },
    /// `gpu_check = "required"` but NVML lists no GPU.
    #[error("the plan sets gpu_check = \"required\" but NVML lists no GPU on this machine")]
    NoGpuListed,
    /// A stage asks for more GPUs than the machine has.
    #[error("stage `{stage}` asks for {wants} GPUs but this machine has {has}")]
    TooManyGpus {
        /// The stage.
        stage: String,
        /// The GPUs it asks for.
        wants: u32,
        /// The GPUs of the machine.
        has: usize,
    },
    /// A stage asks for a host limit (`memory`, `pids`, `cpus`) this host cannot enforce.
    #[error("stage `{stage}` sets {keys} but {why}")]
    HostLimits {
        /// The stage.
        stage: String,
        /// Its limits as written (`memory = "256MiB"`).
        keys: String,
        /// Why they cannot be enforced, and what to do.
        why: String,
    },
}

impl Refusal {
    /// A stable name of the refusal, for programs (the daemon's error answers).
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Slurm(_) => "slurm",
            Refusal::GpuCheckUnavailable { .. } => "gpu_check_unavailable",
            Refusal::NoGpuListed => "no_gpu",
            Refusal::TooManyGpus { .. } => "too_many_gpus",
            Refusal::HostLimits { .. } => "host_limits",
        }
    }
}

/// What a plan that passed preflight runs with.
pub(crate) struct Cleared {
    /// The memory probe, when the GPU check runs.
    pub(crate) probe: Option<Rc<dyn MemoryProbe>>,
    /// The GPU check as the report and the journal describe it.
    pub(crate) gpu_check: String,
    /// NVML is absent because no NVIDIA driver is installed (the run says so in those words).
    pub(crate) no_driver: bool,
    /// The machine's GPUs (stages get them by UUID).
    pub(crate) gpus: Vec<GpuInfo>,
    /// What the host's cgroups offer.
    pub(crate) cgroups: HostCgroups,
    /// Controllers the stages' limits need (all enforceable: see [`host_limits`]).
    pub(crate) controllers: Vec<&'static str>,
    /// Lines for the console: limits left to Slurm.
    pub(crate) limit_notes: Vec<String>,
}

/// Every stage's host limits judged ([`crate::process::cgroup::policy::judge`]): the
/// controllers they need and the lines to say, or the first refusal.
pub(crate) fn host_limits(
    plan: &LoadedPlan,
    cgroups: &HostCgroups,
    job: Option<&Allocation>,
) -> Result<(Vec<&'static str>, Vec<String>), Refusal> {
    use crate::process::cgroup::{policy, Limits};
    let mut controllers: Vec<&'static str> = Vec::new();
    let mut notes = Vec::new();
    for stage in &plan.plan.stages {
        let limits = Limits::of(stage);
        let srun = stage.task_layout().is_some();
        match policy::judge(cgroups, &limits, job.is_some(), srun) {
            policy::Judgement::NoLimits => {}
            policy::Judgement::Enforced => {
                for (_, controller) in limits.requested() {
                    if !controllers.contains(&controller) {
                        controllers.push(controller);
                    }
                }
            }
            policy::Judgement::LeftToSlurm(line) => notes.push(format!("{}: {line}", stage.name)),
            policy::Judgement::Refused(why) => {
                return Err(Refusal::HostLimits {
                    stage: stage.name.clone(),
                    keys: written(stage),
                    why,
                })
            }
        }
    }
    Ok((controllers, notes))
}

/// The refusal of a plan whose host limits (`memory`, `pids`, `cpus`) this host cannot
/// enforce, judged as the run's preflight would (inside the Slurm job this process is in, if
/// any) with `settings`: for `validate` and `run`, which exit 2 with it before anything of the
/// run exists.
pub fn host_limits_refusal(
    plan: &LoadedPlan,
    settings: &crate::settings::Settings,
) -> Option<Refusal> {
    let job = Allocation::detect();
    host_limits(plan, &HostCgroups::detect(settings), job.as_ref()).err()
}

/// A stage's limits as a plan writes them.
fn written(stage: &protocol::plan::Stage) -> String {
    let mut keys = Vec::new();
    if let Some(m) = stage.memory {
        keys.push(format!("memory = \"{m}\""));
    }
    if let Some(p) = stage.pids {
        keys.push(format!("pids = {p}"));
    }
    if let Some(c) = stage.cpus {
        keys.push(format!("cpus = {c}"));
    }
    keys.join(", ")
}

/// Whether `plan` can run on `host` (inside `job`, if in a Slurm allocation); what it runs
/// with if so.
pub(crate) fn check(
    plan: &LoadedPlan,
    host: &Host,
    job: Option<&Allocation>,
) -> Result<Cleared, Refusal> {
    let stages = &plan.plan.stages;
    crate::slurm::srun::check_plan(stages, job)?;
    let gpus = host.gpus().to_vec();
    let setting = plan.plan.run.gpu_check;
    let (probe, gpu_check) = match (&host.inventory.status, setting) {
        (_, GpuCheck::Off) => (None, "off (gpu_check = \"off\")".to_string()),
        (Ok(driver), _) => (
            host.inventory.probe.clone(),
            format!(
                "verified with NVML (driver {driver}, {} GPU(s))",
                gpus.len()
            ),
        ),
        (Err(why), GpuCheck::Required) => {
            return Err(Refusal::GpuCheckUnavailable {
                why: why.to_string(),
            })
        }
        (Err(why), _) => (None, format!("unavailable: {why}")),
    };
    if setting == GpuCheck::Required && gpus.is_empty() {
        return Err(Refusal::NoGpuListed);
    }
    if !gpus.is_empty() {
        if let Some(s) = stages
            .iter()
            .find(|s| s.gpus_wanted() as usize > gpus.len())
        {
            return Err(Refusal::TooManyGpus {
                stage: s.name.clone(),
                wants: s.gpus_wanted(),
                has: gpus.len(),
            });
        }
    }
    let no_driver = matches!(
        host.inventory.status,
        Err(crate::gpu::NvmlUnavailable::NoDriver)
    ) && setting != GpuCheck::Off;
    let cgroups = HostCgroups::detect(&host.settings);
    let (controllers, limit_notes) = host_limits(plan, &cgroups, job)?;
    Ok(Cleared {
        probe,
        gpu_check,
        no_driver,
        gpus,
        cgroups,
        controllers,
        limit_notes,
    })
}

impl From<Refusal> for crate::error::Error {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Slurm(e) => crate::error::Error::Slurm(e),
            other => crate::error::Error::Refused(other.to_string()),
        }
    }
}
