//! Preparing one attempt of a stage: its directories, its inputs (checked to be still what
//! was verified), `spec.json` and `inputs.json`, the worker contract's environment and argv,
//! and where its program is.

use crate::attempt::contract::{self, ContractPaths};
use crate::attempt::launch::AttemptPlan;
use crate::attempt::outcome::Failure;
use crate::gpu::GpuInfo;
use crate::plan::LoadedPlan;
use crate::store::rundir::RunDir;
use protocol::worker::{Device, StageSpec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use super::worker_binary::resolve_worker;

/// The files a stage's attempt starts with: its directories, `inputs.json`, `spec.json` and its
/// (empty) logs. What they hold depends on the plan, the attempt number and the device only, so the
/// preparer ([`crate::attempt::preparer`]) can write a first attempt's ahead of its start.
pub(crate) struct Layout {
    name: String,
    paths: StagePaths,
    inputs: BTreeMap<String, PathBuf>,
    spec: StageSpec,
    /// Whether the attempt gets a rendezvous port of ours (its plan `env` sets no
    /// `MASTER_PORT`): opened ahead, it holds one (see [`crate::attempt::rendezvous`]).
    gets_port: bool,
}

/// The event socket of attempt `attempt` of stage `i`, in the run's socket directory.
pub(crate) fn socket_path(socket_dir: &Path, i: usize, attempt: u32) -> PathBuf {
    use std::io::Write as _;
    // `{i}-{attempt}.sock` written into a buffer on the stack (at most 36 bytes), and the path
    // made in one allocation: `format!` and `join` allocated twice at every stage's look-ahead.
    let mut name = [0u8; 20 + 1 + 10 + 5];
    let mut cursor = std::io::Cursor::new(&mut name[..]);
    write!(cursor, "{i}-{attempt}.sock").expect("36 bytes hold two integers and the suffix");
    let len = cursor.position() as usize;
    let name = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&name[..len]);
    let mut path = PathBuf::with_capacity(socket_dir.as_os_str().len() + 1 + name.len());
    path.push(socket_dir);
    path.push(name);
    path
}

/// Where a stage's files are.
pub(crate) struct StagePaths {
    pub(crate) stage_dir: PathBuf,
    pub(crate) output_dir: PathBuf,
    pub(crate) spec: PathBuf,
    pub(crate) inputs: PathBuf,
}

impl StagePaths {
    /// The paths of stage `name`'s files in `run_dir`.
    pub(crate) fn of(run_dir: &RunDir, name: &str) -> StagePaths {
        let stage_dir = run_dir.stage_dir(name);
        StagePaths {
            output_dir: run_dir.output_dir(name),
            spec: stage_dir.join("spec.json"),
            inputs: stage_dir.join("inputs.json"),
            stage_dir,
        }
    }
}

impl Layout {
    /// Stage `i`'s layout for `attempt` on `device`, with its upstream output directories
    /// (`inputs`; see [`Layout::inputs_of`]).
    pub(crate) fn new(
        plan: &LoadedPlan,
        i: usize,
        run_dir: &RunDir,
        attempt: u32,
        device: Device,
        inputs: BTreeMap<String, PathBuf>,
    ) -> Layout {
        let stage = &plan.plan.stages[i];
        let paths = StagePaths::of(run_dir, &stage.name);
        let spec = StageSpec {
            v: protocol::PROTOCOL_VERSION,
            stage: stage.name.clone(),
            kind: stage.kind,
            params: stage.params.clone(),
            output_dir: paths.output_dir.clone(),
            inputs: inputs.clone(),
            init: stage.init.as_ref().map(|name| run_dir.output_dir(name)),
            device,
            attempt,
            inputs_being_written: Vec::new(),
            input_wait_limit_s: None,
        };
        Layout {
            name: stage.name.clone(),
            paths,
            inputs,
            spec,
            gets_port: !stage.env.contains_key("MASTER_PORT"),
        }
    }

    /// Stage `i`'s upstream output directories, by upstream name.
    pub(crate) fn inputs_of(
        plan: &LoadedPlan,
        i: usize,
        run_dir: &RunDir,
    ) -> BTreeMap<String, PathBuf> {
        plan.upstream[i]
            .iter()
            .map(|&u| {
                let name = &plan.plan.stages[u].name;
                (name.clone(), run_dir.output_dir(name))
            })
            .collect()
    }

    /// Writes the layout (not durably: rewritten for every attempt before it starts); returns
    /// whether the output directory was created now (and so is empty).
    pub(crate) fn write(&self) -> std::io::Result<bool> {
        self.write_files(false).map(|(fresh, _)| fresh)
    }

    /// [`Layout::write`], keeping the logs open and the event socket at `socket` bound and
    /// registered with `runtime`, and holding the attempt's rendezvous port, so that the
    /// attempt starts without opening anything (see [`crate::attempt::preparer`]).
    pub(crate) fn write_and_open(
        &self,
        socket: &Path,
        runtime: &tokio::runtime::Handle,
    ) -> std::io::Result<(bool, crate::attempt::launch::Opened)> {
        let (fresh, logs) = self.write_files(true)?;
        let (stdout, mut stderr) = logs.expect("opened");
        use std::io::Seek;
        let stderr_offset = stderr.seek(std::io::SeekFrom::End(0))?;
        let events = crate::attempt::channel::bind_socket(socket)
            .and_then(|bound| {
                let _entered = runtime.enter();
                crate::attempt::channel::register(bound)
            })
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", socket.display())))?;
        Ok((
            fresh,
            crate::attempt::launch::Opened {
                stdout,
                stderr,
                stderr_offset,
                events,
                socket: socket.to_path_buf(),
                discards: None,
                port: self
                    .gets_port
                    .then(crate::attempt::rendezvous::HeldPort::take)
                    .flatten(),
            },
        ))
    }

    /// The files; the logs' handles too when `keep_logs`.
    #[allow(clippy::type_complexity)]
    fn write_files(
        &self,
        keep_logs: bool,
    ) -> std::io::Result<(bool, Option<(std::fs::File, std::fs::File)>)> {
        let at = |path: &Path| {
            let path = path.to_path_buf();
            move |e: std::io::Error| {
                std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
            }
        };
        let paths = &self.paths;
        let fresh = RunDir::prepare_stage_dirs(&paths.stage_dir, &paths.output_dir)
            .map_err(at(&paths.stage_dir))?;
        std::fs::write(&paths.inputs, pretty(&self.inputs)?).map_err(at(&paths.inputs))?;
        std::fs::write(&paths.spec, pretty(&self.spec)?).map_err(at(&paths.spec))?;
        let open = |log: &str| {
            let path = paths.stage_dir.join(log);
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(at(&path))
        };
        let logs = (open("stdout.log")?, open("stderr.log")?);
        if fresh {
            // The stage's end looks for a manifest here, usually absent. Asking now, on
            // whichever thread writes these files, leaves the kernel's answer (no such file)
            // cached, so that the look at the stage's end does not read the directory from
            // the file system again (on ext4 the largest cost of a short stage's end). A
            // manifest the stage writes replaces the cached answer.
            let _ = std::fs::symlink_metadata(
                paths.output_dir.join(protocol::checkpoint::MANIFEST_FILE),
            );
        }
        tracing::trace!(stage = %self.name, "stage files written");
        Ok((fresh, keep_logs.then_some(logs)))
    }
}

fn pretty(value: &impl serde::Serialize) -> std::io::Result<Vec<u8>> {
    serde_json::to_vec_pretty(value).map_err(std::io::Error::other)
}

/// The verified outputs of a run's stages, by stage index (none for a stage that has not
/// finished).
pub(crate) trait FinishedOutputs {
    /// Stage `stage`'s verified outputs.
    fn outputs_of(&self, stage: usize) -> &[protocol::report::CheckpointRecord];
}

/// What every attempt of a run is prepared from.
#[derive(Clone, Copy)]
pub(crate) struct AttemptContext<'a> {
    /// The run's plan.
    pub(crate) plan: &'a LoadedPlan,
    /// Where the run writes.
    pub(crate) run_dir: &'a RunDir,
    /// The verified outputs of the stages that finished (an attempt's inputs are its upstream
    /// stages' outputs).
    pub(crate) outputs: &'a dyn FinishedOutputs,
    /// The `stage-worker` binary, when a stage of the plan is built in.
    pub(crate) worker: Option<&'a Path>,
    /// Whether stages that ask for GPUs get them (else they run on the CPU).
    pub(crate) machine_has_gpus: bool,
    /// The run's event sockets' directory.
    pub(crate) socket_dir: &'a Path,
}

/// Stage `i`'s inputs: every upstream's output directory, by upstream name, once its recorded
/// files are checked to still be there. Their contents were hashed when the upstream finished
/// (and a built-in stage hashes its inputs again as it reads them), so a look at the sizes
/// suffices here.
fn checked_inputs(
    plan: &LoadedPlan,
    run_dir: &RunDir,
    outputs: &dyn FinishedOutputs,
    i: usize,
) -> Result<BTreeMap<String, PathBuf>, Failure> {
    let stage = &plan.plan.stages[i];
    let mut inputs = BTreeMap::new();
    for &u in &plan.upstream[i] {
        let up = &plan.plan.stages[u];
        let dir = run_dir.output_dir(&up.name);
        for record in outputs.outputs_of(u) {
            let path = Path::new(&record.path);
            let depth = crate::store::checksum::Depth::Size;
            if let Err(mismatch) =
                crate::store::checksum::check_file(path, record.bytes, &record.checksum, depth)
            {
                return Err(Failure::BadInput(format!(
                    "stage `{}` needs `{}`'s output {}, which is {}: rerun the pipeline",
                    stage.name,
                    up.name,
                    record.path,
                    match mismatch {
                        crate::store::checksum::FileMismatch::Missing(_) => "missing",
                        _ => "changed since it was verified",
                    }
                )));
            }
        }
        inputs.insert(up.name.clone(), dir);
    }
    Ok(inputs)
}

/// What the preparer made ahead for a first attempt (see [`crate::attempt::preparer`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prepared {
    /// Whether its output directory was created by the preparer (and so is empty).
    pub(crate) fresh: bool,
    /// The rendezvous port held for it, if its files were opened ahead.
    pub(crate) port: Option<u16>,
}

/// Prepares attempt `attempt` of stage `i` on `gpus`: checks that its inputs are still what
/// was verified, writes its files (unless the preparer did: `prepared` says whether its output
/// directory was new then, and the port it holds for it), and makes its environment and argv. `cpu_threads`: the threads a
/// built-in stage on the CPU uses (its `OMP_NUM_THREADS`, unless set). `being_written`: the
/// upstream stages still persisting their outputs (an early start): its spec names their
/// directories, which its worker waits for, and its files are written here.
pub(crate) fn prepare_attempt(
    context: &AttemptContext<'_>,
    i: usize,
    attempt: u32,
    gpus: &[GpuInfo],
    cpu_threads: Option<usize>,
    prepared: Option<Prepared>,
    being_written: &[usize],
) -> Result<AttemptPlan, Failure> {
    let AttemptContext {
        plan,
        run_dir,
        outputs,
        worker,
        machine_has_gpus,
        socket_dir,
    } = *context;
    let stage = &plan.plan.stages[i];
    // Its `env` as it runs (a matrix instance's values added); the rest is the plan's stage.
    let stage_env = plan.env_as_run(i);
    let io_fail = |what: &str, e: std::io::Error| Failure::SpawnFailed(format!("{what}: {e}"));
    let device = if gpus.is_empty() {
        Device::Cpu
    } else {
        Device::Cuda
    };

    let inputs = checked_inputs(plan, run_dir, outputs, i)?;
    // The files of the attempt: written here, unless the preparer wrote them already (a
    // first attempt on the device it was prepared for; `prepared` says whether its output
    // directory was new).
    let held_port = prepared.and_then(|p| p.port);
    let fresh_output = match prepared.filter(|_| being_written.is_empty()) {
        Some(prepared) => prepared.fresh,
        None => {
            let mut layout = Layout::new(plan, i, run_dir, attempt, device, inputs.clone());
            layout.spec.inputs_being_written = being_written
                .iter()
                .map(|&u| run_dir.output_dir(&plan.plan.stages[u].name))
                .collect();
            if !being_written.is_empty() {
                layout.spec.input_wait_limit_s = stage.timeout().map(|t| t.as_secs_f64());
            }
            layout
                .write()
                .map_err(|e| io_fail("cannot prepare the stage", e))?
        }
    };
    let StagePaths {
        stage_dir,
        output_dir,
        spec: spec_path,
        inputs: inputs_path,
    } = StagePaths::of(run_dir, &stage.name);
    let socket = socket_path(socket_dir, i, attempt);

    let resumable =
        !fresh_output && std::fs::read_dir(&output_dir).is_ok_and(|mut d| d.next().is_some());
    // What earlier attempts left counts for this one only if it writes it again.
    let left_over = if resumable && !stage.outputs.is_empty() {
        crate::attempt::outputs::LeftOver::find(&output_dir, &stage.outputs)
    } else {
        crate::attempt::outputs::LeftOver::default()
    };
    let paths = ContractPaths {
        stage: &stage.name,
        run_dir: run_dir.root(),
        output_dir: &output_dir,
        inputs: &inputs,
        events: &socket,
        spec: &spec_path,
        inputs_file: &inputs_path,
        attempt,
        resumable,
        master_port: crate::attempt::rendezvous::stage_port(&stage_env, held_port),
    };
    let mut env = contract::environment(&paths, &stage_env);
    // Variables orchestrate sets only where neither the plan nor its own environment does.
    let set_elsewhere =
        |name: &str| stage_env.contains_key(name) || std::env::var_os(name).is_some();
    if let Some(n) = cpu_threads {
        if !set_elsewhere("OMP_NUM_THREADS") {
            env.push(("OMP_NUM_THREADS".into(), n.to_string()));
        }
    }
    if machine_has_gpus {
        env.extend(crate::gpu::visible::stage_env(
            gpus,
            plan.plan.run.cuda_visible_devices,
        ));
        if let (Some(bytes), [gpu]) = (stage.gpu_memory, gpus) {
            env.extend(crate::gpu::visible::share_env(bytes.0, gpu, &set_elsewhere));
        }
    }
    if stage.command.is_some() && !gpus.is_empty() {
        env.extend(crate::attempt::flight_recorder::stage_env(
            &stage_dir, attempt, &stage_env,
        ));
    }
    let argv = match (&stage.command, worker) {
        (Some(command), _) => command
            .iter()
            .map(|a| contract::expand(a, &paths))
            .collect(),
        (None, Some(worker)) => vec![
            worker.display().to_string(),
            "--spec".into(),
            spec_path.display().to_string(),
        ],
        (None, None) => return Err(Failure::SpawnFailed("no stage-worker binary".into())),
    };
    Ok(AttemptPlan {
        name: stage.name.clone(),
        attempt,
        argv,
        env,
        cwd: plan.base_dir.clone(),
        stage_dir,
        output_dir,
        builtin: stage.kind.is_some(),
        declared_outputs: stage.outputs.clone(),
        left_over: std::sync::Arc::new(left_over),
        gpus: gpus.to_vec(),
        timeout: stage.timeout(),
        gpus_hidden: machine_has_gpus && gpus.is_empty(),
        gpu_share: stage.gpu_memory.map(|b| b.0).filter(|_| !gpus.is_empty()),
        gpu_sharing: plan.plan.run.gpu_sharing,
        visible_devices: plan.plan.run.cuda_visible_devices,
        mps: None,
        stall: crate::attempt::stall::StallRule::of(
            stage.stall_timeout,
            plan.plan.run.stall_timeout,
        ),
        grace: plan.plan.run.grace.get(),
        rank_grace: stage
            .rank_grace
            .or(plan.plan.run.rank_grace)
            .map_or(crate::attempt::ranks::DEFAULT_GRACE, |g| g.get()),
        socket,
        graceful_to_leader: false,
        preload: match &stage.command {
            Some(_) => stage
                .preload
                .clone()
                .unwrap_or_else(|| plan.plan.run.preload.clone()),
            None => protocol::plan::Preload::default(),
        },
        limits: crate::process::cgroup::Limits::of(stage),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_path_is_the_directory_joined_with_index_dash_attempt_dot_sock() {
        for dir in ["/run/x/sockets", "/run/x/sockets/", "relative", ""] {
            for (i, attempt) in [(0, 1), (7, 2), (19_999, 1), (usize::MAX, u32::MAX)] {
                assert_eq!(
                    socket_path(Path::new(dir), i, attempt),
                    Path::new(dir).join(format!("{i}-{attempt}.sock")),
                    "{dir:?} {i} {attempt}"
                );
            }
        }
    }
}
