//! Starting one attempt of a stage: its GPUs' baselines taken, its event channel opened, its
//! logs opened (or taken from the preparer), its first process spawned ([`start_attempt`]);
//! what a started attempt is ([`Launched`]) and what every attempt of a run shares
//! ([`Services`]).

use crate::attempt::channel::EventChannel;
use crate::attempt::outcome::Failure;
use crate::events::Events;
use crate::gpu::{GpuInfo, MemoryProbe};
use crate::process::reaper::Reaper;
use crate::process::tree::{self as tree, Launch};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

/// How hard the run is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CancelLevel {
    /// Not stopping.
    None,
    /// SIGTERM, grace period, then SIGKILL.
    Graceful,
    /// SIGKILL now.
    Kill,
}

/// A first attempt's files opened ahead of its start by the preparer thread (the run's
/// `stage-files` thread): its logs and its event socket, bound.
#[derive(Debug)]
pub struct Opened {
    /// `stdout.log`, open for appending.
    pub stdout: std::fs::File,
    /// `stderr.log`, open for appending.
    pub stderr: std::fs::File,
    /// Where this attempt's stderr begins in `stderr.log`.
    pub stderr_offset: u64,
    /// The event socket, listening and registered with the runtime.
    pub events: tokio::net::UnixListener,
    /// Where `events` is bound.
    pub socket: PathBuf,
    /// Where the socket file goes when the attempt ends (see [`EventChannel::remove_later`]), and
    /// the log files once its process has them.
    pub discards: Option<crate::process::discard::Discards>,
    /// The attempt's rendezvous port, held until the attempt is about to spawn (none when
    /// its plan sets `MASTER_PORT`, or the kernel gave none).
    pub port: Option<crate::attempt::rendezvous::HeldPort>,
}

impl Opened {
    /// Gives up files opened for an attempt that will not start with them: the logs and the
    /// listener are closed, the socket file removed (files written beside them stay).
    pub fn give_back(self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Everything one attempt needs, resolved by the run loop.
#[derive(Debug, Clone)]
pub struct AttemptPlan {
    /// Stage name.
    pub name: String,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// argv, placeholders expanded.
    pub argv: Vec<String>,
    /// Stage environment (contract variables and the plan's `env`).
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub cwd: PathBuf,
    /// The stage's directory (logs, events).
    pub stage_dir: PathBuf,
    /// The output directory.
    pub output_dir: PathBuf,
    /// Whether the stage is a built-in one (its outputs must carry a manifest).
    pub builtin: bool,
    /// Output files a command stage declared.
    pub declared_outputs: Vec<String>,
    /// The declared outputs earlier attempts left in the output directory, found before this
    /// attempt started: they count only if this attempt writes them again.
    pub left_over: std::sync::Arc<crate::attempt::outputs::LeftOver>,
    /// GPUs given to the attempt.
    pub gpus: Vec<GpuInfo>,
    /// Time limit.
    pub timeout: Option<Duration>,
    /// The machine has GPUs and this attempt got none: its `CUDA_VISIBLE_DEVICES` is empty.
    pub gpus_hidden: bool,
    /// The GPU memory the stage declared (`gpu_memory`): it shares its GPU, and is judged by
    /// `crate::gpu::shared`'s rule.
    pub gpu_share: Option<u64>,
    /// How it shares its GPU (the plan's `gpu_sharing`).
    pub gpu_sharing: protocol::plan::GpuSharing,
    /// How its `CUDA_VISIBLE_DEVICES` names GPUs (the plan's `cuda_visible_devices`).
    pub visible_devices: protocol::plan::VisibleDevices,
    /// Set once it joined its GPU's MPS daemon (`Ok`), or why it could not (`Err`: it shares
    /// the GPU by time slicing).
    pub mps: Option<Result<(), String>>,
    /// When it is judged hung.
    pub stall: crate::attempt::stall::StallRule,
    /// SIGTERM → SIGKILL grace.
    pub grace: Duration,
    /// How long the other ranks may go on after one exits non-zero
    /// ([`crate::attempt::ranks`]).
    pub rank_grace: Duration,
    /// Event socket path.
    pub socket: PathBuf,
    /// Graceful stops (timeout, cancel) send SIGTERM to the first process only, which passes
    /// the stop on its own way (the srun launcher of `slurm::launch`); SIGKILL after the grace
    /// period still goes to every process of the tree.
    pub graceful_to_leader: bool,
    /// A command stage's `preload` (see [`crate::process::tree::Launch::preload`]).
    pub preload: protocol::plan::Preload,
    /// Host limits for its cgroup (`memory`, `pids`, `cpus`).
    pub limits: crate::process::cgroup::Limits,
}

/// Shared services of the run.
pub struct Services {
    /// The reaper.
    pub reaper: Reaper,
    /// Memory probe when the GPU check runs.
    pub probe: Option<Rc<dyn MemoryProbe>>,
    /// Tolerance above baseline, bytes.
    pub tolerance_bytes: u64,
    /// How long to wait for reclaim.
    pub reclaim_timeout: Duration,
    /// Where the run's events go.
    pub events: Events,
    /// Echo every stage's output lines on the console (`--follow`).
    pub follow: bool,
    /// The run's id: stage tokens are scoped by it.
    pub run_id: String,
    /// The run's quarter-second clock: when running stages sample their process tree's
    /// memory, and when the run loop writes a stage start still waiting in the journal.
    pub tree_sampling: TreeSampling,
    /// The run's cgroup, parent of every stage's, where the host lets stages have one.
    pub cgroups: Option<Rc<crate::process::cgroup::RunCgroup>>,
    /// The host's fork servers and zygotes, every stage's start goes through.
    pub forkers: Rc<crate::process::forkers::Forkers>,
    /// The host's MPS daemons, which stages sharing a GPU with `gpu_sharing = "mps"` join.
    pub mps: Rc<crate::gpu::mps::MpsDaemons>,
    /// Whether a stage's GPUs may be handed on at its release
    /// ([`crate::settings::Settings::hand_on_at_release`]).
    pub hand_on_at_release: bool,
}

/// How often a running stage's process tree has its resident memory summed.
pub const TREE_SAMPLE_PERIOD: Duration = Duration::from_millis(250);

/// One clock for every running stage's tree sampling, ticking every [`TREE_SAMPLE_PERIOD`]
/// for as long as it lives: a timer per stage, armed when the stage starts, made every start
/// wake the runtime's driver to re-arm its own (a sweep starts thousands of stages).
pub struct TreeSampling {
    tick: Rc<tokio::sync::Notify>,
    clock: tokio::task::JoinHandle<()>,
}

impl TreeSampling {
    /// Starts the clock. Call inside a `LocalSet`.
    pub fn start() -> TreeSampling {
        let tick = Rc::new(tokio::sync::Notify::new());
        let theirs = tick.clone();
        let clock = tokio::task::spawn_local(async move {
            let start = tokio::time::Instant::now() + TREE_SAMPLE_PERIOD;
            let mut every = tokio::time::interval_at(start, TREE_SAMPLE_PERIOD);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                theirs.notify_waiters();
            }
        });
        TreeSampling { tick, clock }
    }

    /// The next tick.
    pub fn next(&self) -> tokio::sync::futures::Notified<'_> {
        self.tick.notified()
    }
}

impl Drop for TreeSampling {
    fn drop(&mut self) {
        self.clock.abort();
    }
}

/// An attempt whose processes are running.
pub struct Launched {
    pub(crate) plan: AttemptPlan,
    pub(crate) child: tree::StageProcess,
    pub(crate) copiers: Vec<tokio::task::JoinHandle<()>>,
    pub(crate) spawned_unix: f64,
    pub(crate) channel: EventChannel,
    pub(crate) baselines: Vec<crate::gpu::release::GpuBaseline>,
    pub(crate) stderr_offset: u64,
    /// Its place among its GPU's MPS clients, held until its verdict is made.
    pub(crate) mps: Option<crate::gpu::mps::MpsClient>,
}

impl Launched {
    /// PID of the attempt's first process.
    pub fn pid(&self) -> i32 {
        self.child.pid
    }

    /// Where the attempt runs, for a human: "cpu" (saying so when the machine's GPUs are
    /// hidden from it) or its GPUs, and how it was started.
    pub fn placement(&self) -> String {
        let placement = self.gpus_placement();
        let placement = match &self.plan.mps {
            Some(Ok(())) => format!("{placement}, through MPS"),
            Some(Err(why)) => format!("{placement}, time-sliced (no MPS: {why})"),
            None => placement,
        };
        match &self.child.start {
            Some(start) => match &start.fallback {
                None => match start.generation {
                    Some(g) => format!("{placement}, forked from the zygote (generation {g})"),
                    None => format!("{placement}, forked from the zygote"),
                },
                Some(why) => format!("{placement}, exec'd: {why}"),
            },
            None => placement,
        }
    }

    /// Its GPUs for a human ("cpu" without any).
    fn gpus_placement(&self) -> String {
        if self.plan.gpus_hidden {
            // On a machine with GPUs, a stage without `gpus` sees none of them: say so where
            // the user looks, not only in its environment.
            "cpu (no GPU: this machine's GPUs are hidden from it; set `gpus` to give it some)"
                .to_string()
        } else if self.plan.gpus.is_empty() {
            "cpu".to_string()
        } else {
            self.plan
                .gpus
                .iter()
                .map(|g| format!("GPU {} ({})", g.index, g.uuid))
                .collect::<Vec<_>>()
                .join(", ")
        }
    }
}

/// The memory each of the attempt's GPUs holds before anything of it exists (none without a
/// probe): the used memory, or with `gpu_memory` sharing the memory no listed process
/// accounts for (the others' is theirs).
fn gpu_baselines(plan: &AttemptPlan, services: &Services) -> Vec<crate::gpu::release::GpuBaseline> {
    let Some(probe) = &services.probe else {
        return Vec::new();
    };
    plan.gpus
        .iter()
        .map(|g| {
            let used = match plan.gpu_share {
                Some(_) => {
                    crate::gpu::shared::baseline_unlisted(probe.as_ref(), &g.uuid).unwrap_or(0)
                }
                None => probe.used_bytes(&g.uuid).unwrap_or(0),
            };
            crate::gpu::release::GpuBaseline {
                uuid: g.uuid.clone(),
                baseline: used,
                peak: used,
            }
        })
        .collect()
}

/// Takes GPU baselines, opens the event channel and spawns the attempt. An attempt that
/// cannot start comes back as its [`Failure`]. Boxed: a [`Launched`] is a kilobyte, and it
/// goes through the run's news, its table of handed-over attempts and the task that
/// supervises it; a box moves as one pointer.
pub fn start_attempt(
    mut plan: AttemptPlan,
    opened: Option<Opened>,
    services: &Services,
) -> Result<Box<Launched>, Failure> {
    // Files opened ahead serve only the attempt they were made for.
    let opened = opened.filter(|o| o.socket == plan.socket && plan.attempt == 1);
    // A first attempt's output starts its logs; later attempts (retries, resumes) are
    // marked where they begin. (No header on the first keeps an attempt that writes nothing
    // from costing its stage two disk blocks: a 100,000-stage sweep has 200,000 logs.)
    let header = (plan.attempt > 1).then(|| {
        format!(
            "==== orchestrate: {} attempt {} ====\n",
            plan.name, plan.attempt
        )
    });
    let (stdout, stderr, stderr_offset, events) = match opened {
        Some(o) => {
            // The port held for it is released now, before the spawn: the stage binds it.
            drop(o.port);
            (
                o.stdout,
                o.stderr,
                o.stderr_offset,
                Some((o.events, o.discards)),
            )
        }
        None => {
            let (stdout, stderr, offset) =
                open_logs(&plan.stage_dir, header.as_deref()).map_err(|e| {
                    Failure::SpawnFailed(format!(
                        "cannot open log files in {}: {e}",
                        plan.stage_dir.display()
                    ))
                })?;
            (stdout, stderr, offset, None)
        }
    };

    // A client of its GPU's MPS daemon, whose server is listed before the baselines are read.
    let mps = join_mps(&mut plan, services);
    // Baselines come before anything of the stage exists.
    let baselines = gpu_baselines(&plan, services);

    let record_to = plan.stage_dir.join("events.jsonl");
    let mut discards = None;
    let mut channel = match events {
        Some((listener, later)) => {
            discards = later;
            EventChannel::listen(listener, &plan.socket, record_to)
        }
        None => EventChannel::bind(&plan.socket, record_to),
    }
    .map_err(|e| {
        Failure::SpawnFailed(format!(
            "cannot create the event socket {}: {e}",
            plan.socket.display()
        ))
    })?;
    if let Some(discards) = &discards {
        channel.remove_later(discards.clone());
    }
    // Sized at once: `format!` grew its buffer from a few bytes, copying it each time.
    let mut token = String::with_capacity(services.run_id.len() + plan.name.len() + 3 + 10 + 20);
    {
        use std::fmt::Write as _;
        let _ = write!(
            token,
            "{}-{}-{}-{}",
            crate::process::scan::own_pid(),
            services.run_id,
            plan.name,
            crate::timefmt::unix_ms()
        );
    }
    let (out, err) = if services.follow {
        let fail =
            |e: std::io::Error| Failure::SpawnFailed(format!("cannot create an output pipe: {e}"));
        (
            crate::attempt::echo::echoed(stdout, &plan.name, false).map_err(fail)?,
            crate::attempt::echo::echoed(stderr, &plan.name, true).map_err(fail)?,
        )
    } else {
        (
            crate::attempt::echo::direct(stdout),
            crate::attempt::echo::direct(stderr),
        )
    };
    let copiers: Vec<_> = [out.copier, err.copier].into_iter().flatten().collect();
    let gpu_holders = match &services.probe {
        Some(probe) if plan.builtin || !plan.preload.is_off() => plan
            .gpus
            .iter()
            .flat_map(|g| probe.holders(&g.uuid))
            .map(|h| h.pid)
            .collect(),
        _ => Vec::new(),
    };
    // Its own cgroup where the run has one; a stage that asked for limits fails without it.
    let cgroup = match &services.cgroups {
        Some(run) => match run.stage(&plan.name, &plan.limits) {
            Ok(cgroup) => Some(cgroup),
            Err(e) if plan.limits.requested().is_empty() => {
                tracing::warn!("{}: in a process group only: {e}", plan.name);
                None
            }
            Err(e) => {
                return Err(Failure::SpawnFailed(format!(
                    "its limits cannot be set: {e}"
                )))
            }
        },
        None => None,
    };
    let launch = Launch {
        argv: plan.argv.clone(),
        // Nothing after the spawn reads it: moved, not copied.
        env: std::mem::take(&mut plan.env),
        cwd: plan.cwd.clone(),
        stdout: out.stdio,
        stderr: err.stdio,
        token,
        fork_server: plan.builtin,
        gpu_holders,
        preload: plan.preload.clone(),
        // Log files (not `--follow`'s pipes, whose copiers wait for every writer to close)
        // are closed by the thread that opened them ahead.
        close_later: discards.filter(|_| !services.follow),
        cgroup,
    };
    // Taken before the spawn, so that start-up figures include the spawn itself.
    let spawned_unix = crate::timefmt::unix_secs_f64();
    let child = tree::spawn(launch, &services.reaper, &services.forkers).map_err(|e| {
        Failure::SpawnFailed(format!(
            "`{}`: {e}",
            plan.argv.first().map(String::as_str).unwrap_or("")
        ))
    })?;
    Ok(Box::new(Launched {
        plan,
        child,
        copiers,
        spawned_unix,
        channel,
        baselines,
        stderr_offset,
        mps,
    }))
}

/// Makes a stage that shares its one GPU with `gpu_sharing = "mps"` a client of the GPU's MPS
/// daemon: its environment names the daemon (and the GPU as the daemon shows it), and
/// `plan.mps` says whether it joined or why not. The client is held until the stage's verdict.
fn join_mps(plan: &mut AttemptPlan, services: &Services) -> Option<crate::gpu::mps::MpsClient> {
    let [gpu] = plan.gpus.as_slice() else {
        return None;
    };
    if plan.gpu_share.is_none() || plan.gpu_sharing != protocol::plan::GpuSharing::Mps {
        return None;
    }
    let listed = |pid: u32| match &services.probe {
        Some(probe) => probe.holders(&gpu.uuid).iter().any(|h| h.pid == pid),
        None => true,
    };
    match services.mps.join(gpu, plan.visible_devices, &listed) {
        Ok((env, client)) => {
            for (key, value) in env {
                plan.env.retain(|(k, _)| *k != key);
                plan.env.push((key, value));
            }
            plan.mps = Some(Ok(()));
            Some(client)
        }
        Err(why) => {
            tracing::warn!(
                "{}: shares GPU {} by time slicing: {why}",
                plan.name,
                gpu.uuid
            );
            plan.mps = Some(Err(why));
            None
        }
    }
}

/// Opens the stage's logs for appending (its directory exists: see
/// [`crate::store::rundir::RunDir::prepare_stage_dirs`]), writes `header` to both, and returns them
/// with the length of stderr after the header (where this attempt's stderr begins).
fn open_logs(
    stage_dir: &Path,
    header: Option<&str>,
) -> std::io::Result<(std::fs::File, std::fs::File, u64)> {
    use std::io::{Seek, Write};
    let open = |name: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(stage_dir.join(name))
    };
    let mut out = open("stdout.log")?;
    let mut err = open("stderr.log")?;
    if let Some(header) = header {
        out.write_all(header.as_bytes())?;
        err.write_all(header.as_bytes())?;
    }
    let offset = err.seek(std::io::SeekFrom::End(0))?;
    Ok((out, err, offset))
}
