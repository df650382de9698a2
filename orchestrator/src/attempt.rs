//! Preparing one attempt of a stage: its directories, its inputs (checked to be still what
//! was verified), `spec.json` and `inputs.json`, the worker contract's environment and argv,
//! and where its program is.

use crate::contract::{self, ContractPaths};
use crate::gpu::GpuInfo;
use crate::plan::LoadedPlan;
use crate::rundir::RunDir;
use crate::stage::{AttemptPlan, Failure};
use crate::state::StageState;
use anyhow::{bail, Context};
use protocol::worker::{Device, StageSpec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Finds the `stage-worker` binary: the explicit path, the plan's `run.worker` (relative to
/// the plan's directory), `$ORCHESTRATE_WORKER`, or the file beside this executable.
pub fn resolve_worker(explicit: Option<&Path>, plan: &LoadedPlan) -> anyhow::Result<PathBuf> {
    let candidate = if let Some(p) = explicit {
        p.to_path_buf()
    } else if let Some(p) = &plan.plan.run.worker {
        plan.base_dir.join(p)
    } else if let Some(p) = std::env::var_os("ORCHESTRATE_WORKER") {
        PathBuf::from(p)
    } else {
        let exe = std::env::current_exe().context("cannot find this executable's path")?;
        exe.with_file_name("stage-worker")
    };
    if !candidate.is_file() {
        bail!(
            "the built-in stage worker was not found at {}: build it (`cargo build --release -p stage-worker`), or point `run.worker` in the plan or --worker at it",
            candidate.display()
        );
    }
    Ok(candidate)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn prepare_attempt(
    plan: &LoadedPlan,
    i: usize,
    attempt: u32,
    run_dir: &RunDir,
    states: &[StageState],
    worker: Option<&Path>,
    gpus: &[GpuInfo],
    machine_has_gpus: bool,
    socket_dir: &Path,
    cpu_threads: Option<usize>,
) -> Result<AttemptPlan, Failure> {
    let stage = plan.stage_as_run(i);
    let io_fail = |what: &str, e: std::io::Error| Failure::SpawnFailed(format!("{what}: {e}"));
    let fresh_output = run_dir
        .prepare_stage(&stage.name)
        .map_err(|e| io_fail("cannot create the stage directory", e))?;
    let stage_dir = run_dir.stage_dir(&stage.name);
    let output_dir = run_dir.output_dir(&stage.name);

    // Inputs: every upstream's output directory, whose recorded files must still be there.
    // Their contents were hashed when the upstream finished (and a built-in stage hashes its
    // inputs again as it reads them), so a look at the sizes suffices here.
    let mut inputs = BTreeMap::new();
    for &u in &plan.upstream[i] {
        let up = &plan.plan.stages[u];
        let dir = run_dir.output_dir(&up.name);
        if let Some(result) = &states[u].last {
            for record in result.checkpoints() {
                let path = Path::new(&record.path);
                let depth = crate::checksum::Depth::Size;
                if let Err(mismatch) =
                    crate::checksum::check_file(path, record.bytes, &record.sha256, depth)
                {
                    return Err(Failure::BadInput(format!(
                        "stage `{}` needs `{}`'s output {}, which is {}: rerun the pipeline",
                        stage.name,
                        up.name,
                        record.path,
                        match mismatch {
                            crate::checksum::FileMismatch::Missing(_) => "missing",
                            _ => "changed since it was verified",
                        }
                    )));
                }
            }
        }
        inputs.insert(up.name.clone(), dir);
    }
    let init = stage.init.as_ref().map(|name| run_dir.output_dir(name));
    let spec_path = stage_dir.join("spec.json");
    let inputs_path = stage_dir.join("inputs.json");
    let inputs_bytes =
        serde_json::to_vec_pretty(&inputs).map_err(|e| Failure::SpawnFailed(e.to_string()))?;
    std::fs::write(&inputs_path, &inputs_bytes)
        .map_err(|e| io_fail(&format!("cannot write {}", inputs_path.display()), e))?;
    let socket = socket_dir.join(format!("{i}-{attempt}.sock"));
    let spec = StageSpec {
        v: protocol::PROTOCOL_VERSION,
        stage: stage.name.clone(),
        kind: stage.kind,
        params: stage.params.clone(),
        output_dir: output_dir.clone(),
        inputs: inputs.clone(),
        init,
        device: if gpus.is_empty() {
            Device::Cpu
        } else {
            Device::Cuda
        },
        attempt,
    };
    let spec_bytes =
        serde_json::to_vec_pretty(&spec).map_err(|e| Failure::SpawnFailed(e.to_string()))?;
    // Rewritten for every attempt before it starts: no need for a durable, atomic write.
    std::fs::write(&spec_path, &spec_bytes)
        .map_err(|e| io_fail(&format!("cannot write {}", spec_path.display()), e))?;

    let paths = ContractPaths {
        stage: &stage.name,
        run_dir: run_dir.root(),
        output_dir: &output_dir,
        inputs: &inputs,
        events: &socket,
        spec: &spec_path,
        inputs_file: &inputs_path,
        attempt,
        resumable: !fresh_output
            && std::fs::read_dir(&output_dir).is_ok_and(|mut d| d.next().is_some()),
    };
    let mut env = contract::environment(&paths, &stage.env);
    if let Some(n) = cpu_threads {
        if !stage.env.contains_key("OMP_NUM_THREADS")
            && std::env::var_os("OMP_NUM_THREADS").is_none()
        {
            env.push(("OMP_NUM_THREADS".into(), n.to_string()));
        }
    }
    if machine_has_gpus {
        let visible = gpus
            .iter()
            .map(|g| g.uuid.as_str())
            .collect::<Vec<_>>()
            .join(",");
        env.push(("CUDA_VISIBLE_DEVICES".into(), visible));
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
        gpus: gpus.to_vec(),
        timeout: stage.timeout(),
        grace: plan.plan.run.grace.get(),
        socket,
        graceful_to_leader: false,
    })
}
