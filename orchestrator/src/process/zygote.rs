//! Python command stages forked from a zygote: one Python process per interpreter, preload
//! list and shared environment, which has imported the stage's heavy modules (`preload` in
//! the plan) without initialising CUDA, and forks each stage from there.
//!
//! The zygote speaks the fork server protocol of [`protocol::fork`] (its Python side,
//! `python/orchestrate_zygote.py`, is embedded in this binary) and is started and spoken to
//! by the same code as `stage-worker`'s fork server ([`crate::process::fork_server`]): a
//! forked stage is re-parented to this process (a child subreaper), is in its own session,
//! dies with it, and from then on is reaped, scanned, stopped and GPU-verified exactly like
//! an exec'd stage. The zygote never holds a stage's process: killing it leaves every running
//! stage alone.
//!
//! A stage is forked only when the zygote can promise what `exec` would have given it;
//! otherwise [`spawn`] says why ([`Fallback`]) and the caller execs:
//! - its command is `PYTHON SCRIPT ARGS…` or `PYTHON -m MODULE ARGS…`, where `PYTHON` is
//!   found in the stage's `PATH` as `execvp` would and is named like an interpreter
//!   (`python`, `python3`, `python3.12`; a virtual environment's counts as its own);
//! - no environment variable that the preload imports read through `os.environ` differs
//!   between the zygote and the stage. The zygote is keyed by the whole environment except
//!   the variables orchestrate sets for each stage alone (`ORCHESTRATE_*`, `MASTER_PORT`):
//!   the GPUs a stage is given (`CUDA_VISIBLE_DEVICES`) are part of the key, because
//!   frameworks read them at import (DeepSpeed's accelerator counts the devices). So in
//!   practice a stage falls back when a preloaded module read an `ORCHESTRATE_*` variable;
//! - the zygote did not initialise CUDA (it checks before every fork, and NVML must not list
//!   it on the stage's GPUs), has not exited, and answers;
//! - the zygote runs one thread (it checks after each preload import, naming the import that
//!   started threads, and before every fork; a thread pool that a fork handler stops, as
//!   OpenBLAS's, does not count), and says so in its ready message;
//! - every file the zygote imported (and the site-packages directories) is as it was when it
//!   was imported, checked before every fork: on a change the zygote answers `stale`, is
//!   retired and replaced by a fresh one importing in the background ([`Fallback::Stale`]);
//!   so a daemon's zygote never serves code that a fix or an upgrade replaced.
//!
//! A forked stage reseeds the generators it inherited before its first line (Python's
//! `random`, numpy's legacy global state, torch's CPU generator), as a fresh interpreter would
//! have seeded them.
//!
//! A zygote imports in the background (a thread awaits its readiness): the stages that need
//! it before it is ready are exec'd, so the thread that starts stages (a run's loop, or the
//! daemon's, shared by every run) never waits for imports that take seconds. A zygote that
//! failed once is not used again by this process. `ORCHESTRATE_ZYGOTE=0` turns zygotes off.

use crate::process::fork_server::{self, ForkServerError, Server};
use crate::process::reaper::Reaper;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// Environment variable that turns zygotes off (`0`, `off`, `false`, `no`; read into
/// [`crate::settings::Settings::zygote`]).
pub const ENV_ZYGOTE: &str = crate::settings::ZYGOTE;

/// The zygote's Python side.
const SOURCE: &str = include_str!("../../../python/orchestrate_zygote.py");

/// How long a zygote may take to import its preload modules (`torch` + `transformers` +
/// `deepspeed` took 10.7 s on a GPU host, 15 s on a small CPU one).
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Set in the zygote only: torch answers `is_available()` from NVML instead of initialising
/// CUDA. Its value in the zygote is not compared with the stage's.
const NVML_CHECK_VAR: &str = "PYTORCH_NVML_BASED_CUDA_CHECK";

/// Whether orchestrate sets `name` for one stage alone (so it is not part of a zygote's key,
/// and the zygote does not have it).
pub fn per_stage_variable(name: &str) -> bool {
    name.starts_with("ORCHESTRATE_") || crate::attempt::rendezvous::PORT_VARS.contains(&name)
}

/// Why a stage was exec'd instead of forked from a zygote.
#[derive(Debug, thiserror::Error)]
pub enum Fallback {
    /// `ORCHESTRATE_ZYGOTE=0`.
    #[error("zygotes are turned off ({ENV_ZYGOTE}=0)")]
    Disabled,
    /// The program is not a Python interpreter.
    #[error("`{0}` is not a Python interpreter")]
    NotPython(String),
    /// The interpreter could not be found.
    #[error("`{program}` is not found in the stage's PATH: {source}")]
    NotFound {
        /// argv\[0\].
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// The command is not a plain `python SCRIPT` or `python -m MODULE`.
    #[error("the command is not `python SCRIPT …` or `python -m MODULE …` (interpreter options, `-c` and launchers such as `torchrun` start fresh interpreters)")]
    NotPlainRun,
    /// The script does not exist (exec gives Python's own error for it).
    #[error("the script {0} does not exist")]
    NoScript(PathBuf),
    /// A variable the preload imports read differs.
    #[error("the preload imports read `{name}`, which is {} for this stage and {} in the zygote", shown(.stage), shown(.zygote))]
    EnvRead {
        /// The variable.
        name: String,
        /// Its value for the stage.
        stage: Option<String>,
        /// Its value in the zygote.
        zygote: Option<String>,
    },
    /// The zygote is still importing the preload modules (started `seconds` ago): the run
    /// does not wait for it, later stages of its key are forked once it is ready.
    #[error("the zygote is still importing its preload modules (started {seconds:.1} s ago)")]
    Starting {
        /// How long ago it was started.
        seconds: f64,
    },
    /// A file the zygote imported changed on disk since (a fix, `pip install -U`): that
    /// zygote was retired and a fresh one started, which imports the new code; the stage does
    /// not wait for it.
    #[error("the zygote's preloaded code is out of date ({reason}): it was retired, and a fresh zygote is importing the new code")]
    Stale {
        /// What changed.
        reason: String,
    },
    /// The zygote cannot serve (it refused, is gone, or failed earlier).
    #[error("the zygote cannot serve: {0}")]
    Zygote(#[from] ForkServerError),
}

fn shown(value: &Option<String>) -> String {
    match value {
        Some(v) => format!("{v:?}"),
        None => "unset".into(),
    }
}

/// One Python stage to start: the worker (its whole environment, among the rest), and the
/// modules its zygote preloads.
pub struct PythonStage<'a> {
    /// What its process is given.
    pub worker: fork_server::Worker<'a>,
    /// The modules to preload.
    pub preload: &'a [String],
}

struct Zygote {
    server: Server,
    /// The environment it was started with.
    env: Vec<(String, String)>,
}

enum State {
    /// Started, importing: a thread awaits its readiness.
    Starting(Starting),
    Serving(Zygote),
    Failed(Arc<ForkServerError>),
}

/// A zygote started and not ready yet, with the environment it was started with.
struct Starting {
    server: fork_server::Starting,
    env: Vec<(String, String)>,
}

/// The zygotes of one host, by key (interpreter, preload, environment): owned by the host
/// (`crate::host::Host`, in its `crate::process::forkers::Forkers`) and stopped with it. Lives
/// on the host's thread.
pub struct Zygotes {
    /// Whether Python stages with `preload` may be forked from a zygote (`ORCHESTRATE_ZYGOTE`).
    enabled: bool,
    zygotes: RefCell<HashMap<u64, State>>,
}

/// The environment a zygote of `stage` is started with: the stage's, less what orchestrate
/// sets per stage, with torch's NVML-based CUDA check.
fn zygote_env(stage: &PythonStage<'_>) -> Vec<(String, String)> {
    stage
        .worker
        .env
        .iter()
        .filter(|(k, _)| !per_stage_variable(k) && *k != NVML_CHECK_VAR)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain([(NVML_CHECK_VAR.to_string(), "1".to_string())])
        .collect()
}

/// Stops `zygote`, which could not fork (`why`), and says what takes its place and why the
/// stage is exec'd: a zygote whose code went out of date is replaced by a fresh one
/// (`restart`), importing in the background; any other failure leaves its key exec'd for
/// good (it refused: CUDA, threads; it is gone; it answered wrongly).
fn retire(
    zygote: Zygote,
    why: ForkServerError,
    restart: impl FnOnce() -> State,
) -> (State, Fallback) {
    fork_server::stop(zygote.server);
    if let ForkServerError::Stale { reason } = why {
        tracing::info!("zygote retired: {reason}; a fresh one is importing the new code");
        return (restart(), Fallback::Stale { reason });
    }
    tracing::warn!("zygote stopped: {why}; its Python stages are exec'd from now on");
    let why = Arc::new(why);
    (
        State::Failed(why.clone()),
        ForkServerError::Unusable(why).into(),
    )
}

/// A starting zygote's state now: serving once it said it is ready, failed if it never will.
fn ready(starting: Starting) -> State {
    let Some(reply) = starting.server.poll() else {
        return State::Starting(starting);
    };
    match starting.server.finish(reply) {
        Ok(server) => {
            tracing::debug!(
                pid = server.pid,
                "zygote ready, its imports read {} variables",
                server.env_read.len()
            );
            State::Serving(Zygote {
                server,
                env: starting.env,
            })
        }
        Err(why) => failed(why),
    }
}

fn failed(why: ForkServerError) -> State {
    tracing::warn!("zygote unavailable: {why}; its Python stages are exec'd");
    State::Failed(Arc::new(why))
}

impl Zygotes {
    /// None started yet (a zygote starts with the first stage of its key); `enabled`: whether
    /// any may be.
    pub fn new(enabled: bool) -> Zygotes {
        Zygotes {
            enabled,
            zygotes: RefCell::new(HashMap::new()),
        }
    }

    /// Starts `stage` by forking it from its zygote. The first stage of a zygote's key starts
    /// it and is exec'd: the zygote imports in the background and this thread (a run's loop, or
    /// the daemon's every run) never waits for it; stages of that key are forked once it is
    /// ready. Returns the stage's PID: a child of this process in its own session, not yet
    /// registered with `reaper` (register it before the next `.await`). An error says why the
    /// caller should exec instead.
    pub fn spawn(&self, stage: &PythonStage<'_>, reaper: &Reaper) -> Result<i32, Fallback> {
        if !self.enabled {
            return Err(Fallback::Disabled);
        }
        let interpreter = plain_python_run(stage)?;
        let env = zygote_env(stage);
        let key = {
            let mut sorted: Vec<&(String, String)> = env.iter().collect();
            sorted.sort();
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&interpreter, stage.preload, sorted).hash(&mut h);
            h.finish()
        };
        let mut zygotes = self.zygotes.borrow_mut();
        let state = match zygotes.remove(&key) {
            None => start(&interpreter, stage.preload, env, reaper),
            Some(State::Starting(starting)) => ready(starting),
            Some(other) => other,
        };
        let zygote = match zygotes.entry(key).or_insert(state) {
            State::Serving(z) => z,
            State::Starting(starting) => {
                return Err(Fallback::Starting {
                    seconds: starting.server.elapsed().as_secs_f64(),
                })
            }
            State::Failed(why) => return Err(ForkServerError::Unusable(why.clone()).into()),
        };
        env_mismatch(zygote, stage.worker.env)?;
        let why = match fork_server::fork(&mut zygote.server, &stage.worker) {
            Ok(pid) => return Ok(pid),
            Err(why) => why,
        };
        let Some(State::Serving(old)) = zygotes.remove(&key) else {
            unreachable!("the zygote just asked was serving")
        };
        let (next, fallback) = retire(old, why, || {
            start(&interpreter, stage.preload, zygote_env(stage), reaper)
        });
        zygotes.insert(key, next);
        Err(fallback)
    }

    /// Stops every zygote of the host and waits until they are gone.
    pub fn shutdown(&self) {
        for (_, state) in self.zygotes.borrow_mut().drain() {
            match state {
                State::Serving(zygote) => fork_server::stop(zygote.server),
                State::Starting(starting) => starting.server.stop(),
                State::Failed(_) => {}
            }
        }
    }
}

/// The interpreter of a `python SCRIPT …` / `python -m MODULE …` command, as exec would find
/// it (not resolved further: a virtual environment's `bin/python` is what makes it one).
fn plain_python_run(stage: &PythonStage<'_>) -> Result<PathBuf, Fallback> {
    let program = stage.worker.argv.first().map(String::as_str).unwrap_or("");
    if !is_python_name(program.rsplit('/').next().unwrap_or(program)) {
        return Err(Fallback::NotPython(program.into()));
    }
    let path_var = stage
        .worker
        .env
        .iter()
        .rev()
        .find(|(k, _)| *k == "PATH")
        .map(|(_, v)| *v);
    let (interpreter, _) = crate::process::spawn::resolve(program, path_var, stage.worker.cwd)
        .map_err(|source| Fallback::NotFound {
            program: program.into(),
            source,
        })?;
    let interpreter = if interpreter.is_relative() {
        stage.worker.cwd.join(interpreter)
    } else {
        interpreter
    };
    match stage.worker.argv.get(1).map(String::as_str) {
        Some("-m")
            if stage
                .worker
                .argv
                .get(2)
                .is_some_and(|m| !m.starts_with('-')) =>
        {
            Ok(interpreter)
        }
        Some(script) if !script.starts_with('-') => {
            let path = stage.worker.cwd.join(script);
            if path.is_file() {
                Ok(interpreter)
            } else {
                Err(Fallback::NoScript(path))
            }
        }
        _ => Err(Fallback::NotPlainRun),
    }
}

/// `python`, `python3`, `python3.12`.
fn is_python_name(name: &str) -> bool {
    name.strip_prefix("python")
        .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// The first variable the zygote's imports read whose value differs for the stage.
fn env_mismatch(zygote: &Zygote, stage_env: &[(&str, &str)]) -> Result<(), Fallback> {
    for name in &zygote.server.env_read {
        if name == NVML_CHECK_VAR {
            continue;
        }
        let ours = zygote
            .env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str());
        let theirs = stage_env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v);
        if ours != theirs {
            return Err(Fallback::EnvRead {
                name: name.clone(),
                stage: theirs.map(str::to_string),
                zygote: ours.map(str::to_string),
            });
        }
    }
    Ok(())
}

/// Starts the zygote of `interpreter` and `preload` with `env`, in the background.
fn start(
    interpreter: &Path,
    preload: &[String],
    env: Vec<(String, String)>,
    reaper: &Reaper,
) -> State {
    let mut cmd = Command::new(interpreter);
    cmd.arg("-c")
        .arg(SOURCE)
        .arg("3")
        .args(preload)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir("/");
    match fork_server::start_server_in_background(cmd, READY_TIMEOUT, reaper) {
        Ok(server) => State::Starting(Starting { server, env }),
        Err(why) => failed(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpreter_names_and_per_stage_variables() {
        for yes in ["python", "python3", "python3.12"] {
            assert!(is_python_name(yes), "{yes}");
        }
        for no in ["pythonw-x", "ipython", "torchrun", "python3-config", ""] {
            assert!(!is_python_name(no), "{no}");
        }
        assert!(per_stage_variable("ORCHESTRATE_OUTPUT_DIR"));
        assert!(per_stage_variable("MASTER_PORT"));
        assert!(!per_stage_variable("CUDA_VISIBLE_DEVICES"));
        assert!(!per_stage_variable("HF_HOME"));
    }
}
