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
//!
//! A zygote learns ([`learning`]): a forked stage writes, at its exit, the modules it imported
//! itself; [`after_exit`] reads them into the report and adds those the zygote could import
//! to its lineage; the next stage of that key starts the next *generation* (a fresh zygote
//! that imports the plan's modules and the learned ones) in the background, and is forked
//! from the serving generation meanwhile. A learned module that fails to import, starts a
//! thread, initialises CUDA or reads a per-stage variable is left out, named, and not asked
//! for again. `preload = "auto"` starts from no module at all; its first zygote, with nothing
//! to import, is awaited (a bare interpreter starts in some 50 ms, at most [`BARE_WAIT`]) so
//! that the first stage is forked and teaches it.
//!
//! A zygote also reads ahead, while learning is on: a zygote with something to import reads
//! the script of the stage it is started for and imports what that script imports at its top
//! level (not the user's own modules; checked as learned modules are) before it is ready, so
//! the first stage it forks finds them held, in the first sweep from an empty cache too; what
//! it imported so is kept as learned and named in the report ([`StageStart::read_ahead`]). A
//! fork names what the stage's script imports that the zygote lacks, and the lineage learns
//! it at once, before the stage ends.

mod learning;

use crate::process::fork_server::standby::{gives_gpus, Standbys};
use crate::process::fork_server::{self, ForkServerError, Server};
use crate::process::reaper::Reaper;
use protocol::plan::Preload;
use protocol::report::{ImportedAfterFork, StageStart, StartVia};
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// Environment variable that turns zygotes off (`0`, `off`, `false`, `no`).
pub const ENV_ZYGOTE: &str = "ORCHESTRATE_ZYGOTE";

/// The zygote's Python side.
const SOURCE: &str = include_str!("../../../python/orchestrate_zygote.py");

/// How long a zygote may take to import its preload modules (`torch` + `transformers` +
/// `deepspeed` took 10.7 s on a GPU host, 15 s on a small CPU one).
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// How long a zygote with nothing to import (`"auto"`'s first) is awaited.
const BARE_WAIT: Duration = Duration::from_secs(3);

/// A stage that comes while its zygote still imports, at least this long after the zygote
/// started, came after an earlier stage of the sweep rather than beside it ([`LATE_GRACE`]).
const LATE_STAGE: Duration = Duration::from_secs(5);

/// How long such a late stage waits for the zygote, once per zygote start: the zygote began
/// with the sweep's first stage and is near its end, where an exec'd stage would import
/// everything again from nothing (on an H100, a zygote that read ahead was ready 0.04 s after
/// the second stage of a chained sweep came, which was exec'd for 15.7 s).
const LATE_GRACE: Duration = Duration::from_secs(2);

/// How many of the modules a forked stage imported itself its report names.
const IMPORTED_NAMED: usize = 5;

/// Set in the zygote only: torch answers `is_available()` from NVML instead of initialising
/// CUDA. Its value in the zygote is not compared with the stage's.
const NVML_CHECK_VAR: &str = "PYTORCH_NVML_BASED_CUDA_CHECK";

/// Whether orchestrate sets `name` for one stage alone (so it is not part of a zygote's key,
/// and the zygote does not have it).
pub fn per_stage_variable(name: &str) -> bool {
    name.starts_with("ORCHESTRATE_")
        || protocol::worker::ENV_PORT_VARS.contains(&name)
        || protocol::worker::ENV_FLIGHT_RECORDER_FILES.contains(&name)
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
    /// The modules to preload, or `"auto"`.
    pub preload: &'a Preload,
}

/// A stage forked from a zygote.
#[derive(Debug, Clone)]
pub struct Forked {
    /// Its PID.
    pub pid: i32,
    /// The generation of the zygote it was forked from.
    pub generation: u32,
    /// The modules its lineage learned and leaves out, and why.
    pub left_out: Vec<protocol::fork::LeftOut>,
    /// What that zygote read ahead from the script of the stage it was started for (see
    /// [`StageStart::read_ahead`]).
    pub read_ahead: Option<protocol::fork::ReadAhead>,
    /// It began as a standby of that zygote (see [`Zygotes`]).
    pub standby: bool,
    /// Why it did not, when a standby was asked for (see [`StageStart::standby_passed_over`]).
    pub standby_passed_over: Option<String>,
}

/// Which zygote: the interpreter and `preload` (its lineage, what it learns is kept by) and
/// the environment it starts with; and the command of the stage it is started for, whose
/// script a zygote reads ahead.
struct Key<'a> {
    interpreter: PathBuf,
    preload: &'a Preload,
    lineage: String,
    argv: &'a [String],
    cwd: &'a Path,
}

struct Zygote {
    server: Server,
    /// The environment it was started with.
    env: Vec<(String, String)>,
    /// Which generation of its lineage it is.
    generation: u32,
    /// The learned modules it imported (those it left out are not among them).
    learned: Vec<String>,
    /// The learned modules its lineage leaves out, and why.
    left_out: Vec<protocol::fork::LeftOut>,
    /// What it read ahead from the script of the stage it was started for, and imported.
    read_ahead: Option<protocol::fork::ReadAhead>,
    /// [`learning::changes`] when it last looked at what its lineage learned.
    seen: u64,
    /// Its next generation, importing while this one serves.
    next: Option<Box<Starting>>,
    /// A next generation failed: this one serves on, and no other is started.
    next_failed: bool,
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
    lineage: String,
    generation: u32,
    learned: Vec<String>,
    seen: u64,
    /// The environment of the latest stage with GPUs exec'd while it imports: once it is ready
    /// ([`standbys_when_ready`]), a standby is readied under it for the stage after.
    standby_for: Option<Vec<(String, String)>>,
    /// Whether a late stage waited for it already ([`LATE_GRACE`]).
    graced: bool,
}

thread_local! {
    static ZYGOTES: RefCell<HashMap<u64, State>> = RefCell::new(HashMap::new());
}

/// Starts `stage` by forking it from its zygote. The first stage of a zygote's key starts
/// it and is exec'd: the zygote imports in the background and this thread (a run's loop, or
/// the daemon's every run) does not wait for it; stages of that key are forked once it is
/// ready (a zygote with nothing to import is awaited, up to [`BARE_WAIT`]; the first stage
/// that comes late in its imports, up to [`LATE_GRACE`]). What its lineage
/// learned since it started makes this call start its next generation, in the background.
/// Returns the stage's PID (a child of this process in its own session, not yet registered
/// with `reaper`: register it before the next `.await`) and generation. An error says why
/// the caller should exec instead.
fn spawn(
    stage: &PythonStage<'_>,
    reaper: &Reaper,
    standbys: &Standbys,
) -> Result<Forked, Fallback> {
    let interpreter = plain_python_run(stage)?;
    let env = zygote_env(stage);
    let key = {
        let mut sorted: Vec<&(String, String)> = env.iter().collect();
        sorted.sort();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&interpreter, stage.preload, sorted).hash(&mut h);
        h.finish()
    };
    let lineage = Key {
        lineage: learning::lineage(&interpreter, stage.preload),
        interpreter,
        preload: stage.preload,
        argv: stage.worker.argv,
        cwd: stage.worker.cwd,
    };
    ZYGOTES.with(|zygotes| {
        let mut zygotes = zygotes.borrow_mut();
        let state = match zygotes.remove(&key) {
            None => start(&lineage, env, reaper),
            Some(State::Starting(starting)) => ready_or_late(starting),
            Some(State::Serving(zygote)) => {
                State::Serving(advance(zygote, Place { key, standbys }, &lineage, reaper))
            }
            Some(failed) => failed,
        };
        let zygote = match zygotes.entry(key).or_insert(state) {
            State::Serving(z) => z,
            State::Starting(starting) => {
                if gives_gpus(stage.worker.env) {
                    starting.standby_for = Some(standby_env(stage.worker.env));
                }
                return Err(Fallback::Starting {
                    seconds: starting.server.elapsed().as_secs_f64(),
                });
            }
            State::Failed(why) => return Err(ForkServerError::Unusable(why.clone()).into()),
        };
        env_mismatch(zygote, stage.worker.env)?;
        let imports = imports_file(&stage.worker);
        let mut env = stage.worker.env.to_vec();
        if let Some(to) = imports.as_deref().and_then(Path::to_str) {
            env.push((learning::IMPORTS_VAR, to));
        }
        let worker = fork_server::Worker {
            env: &env,
            ..stage.worker
        };
        let standby_of = standby_key(key, zygote.generation);
        let (started, passed_over) = match standbys.adopt(&standby_of, &worker) {
            Ok(pid) => (Ok((pid, true, Vec::new())), None),
            Err(why) => (
                fork_server::fork_telling_lacks(&mut zygote.server, &worker)
                    .map(|(pid, lacks)| (pid, false, lacks)),
                why,
            ),
        };
        let why = match started {
            Ok((pid, standby, lacks)) => {
                let added = learning::learn_modules(&lineage.lineage, &lacks);
                if added > 0 {
                    tracing::info!(
                        "the stage's script imports {added} modules its zygote lacks: its next \
                         generation imports them"
                    );
                }
                if gives_gpus(stage.worker.env) {
                    let env = standby_env(stage.worker.env);
                    standbys.request(&mut zygote.server, &standby_of, &env, true);
                }
                return Ok(Forked {
                    pid,
                    generation: zygote.generation,
                    left_out: zygote.left_out.clone(),
                    read_ahead: zygote.read_ahead.clone(),
                    standby,
                    standby_passed_over: passed_over,
                });
            }
            Err(why) => why,
        };
        let Some(State::Serving(old)) = zygotes.remove(&key) else {
            unreachable!("the zygote just asked was serving")
        };
        let (next, fallback) = retire(old, why, || start(&lineage, zygote_env(stage), reaper));
        zygotes.insert(key, next);
        Err(fallback)
    })
}

/// Where a stage forked for `worker` writes, at its exit, what it imported itself (its stage
/// directory, the parent of `ORCHESTRATE_SPEC`), unless learning is off; an earlier attempt's
/// file there, which would be read as this one's, is removed.
fn imports_file(worker: &fork_server::Worker<'_>) -> Option<PathBuf> {
    if !learning::enabled() {
        return None;
    }
    let spec = worker
        .env
        .iter()
        .rev()
        .find(|(k, _)| *k == protocol::worker::ENV_SPEC)?
        .1;
    let to = Path::new(spec).parent()?.join(learning::IMPORTS_FILE);
    let _ = std::fs::remove_file(&to);
    Some(to)
}

/// The environment a standby is asked for under after a stage with environment `env`: the
/// stage's, less what orchestrate sets per stage, as a zygote's. The standby becomes a later
/// stage, which brings its own at adoption; and its imports ahead, which are recorded with
/// the variables they read, must not see another stage's values (tqdm's import reads every
/// variable to pick out its own, and most frameworks import tqdm).
fn standby_env(env: &[(&str, &str)]) -> Vec<(String, String)> {
    (env.iter())
        .filter(|(k, _)| !per_stage_variable(k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The name the standbys of generation `generation` of the zygote of `key` go by among a
/// host's standbys: a stage takes on only a standby of the generation it is reported forked
/// from (an older one's is left to expire).
fn standby_key(key: u64, generation: u32) -> PathBuf {
    PathBuf::from(format!("zygote-{key:016x}-{generation}"))
}

/// A forked stage's `start` once the stage has exited, with what it imported itself (read
/// from the file it wrote in `stage_dir` at its exit, then removed); its lineage learns the
/// modules its zygote could import. Any other start comes back as it was.
pub fn after_exit(start: Option<StageStart>, stage_dir: &Path) -> Option<StageStart> {
    let mut start = start?;
    if start.via != StartVia::Zygote {
        return Some(start);
    }
    let path = stage_dir.join(learning::IMPORTS_FILE);
    let Ok(text) = std::fs::read(&path) else {
        return Some(start);
    };
    let _ = std::fs::remove_file(&path);
    match serde_json::from_slice::<learning::ImportsReport>(&text) {
        Ok(report) => {
            start.imported = Some(ImportedAfterFork {
                count: u32::try_from(report.imported.len()).unwrap_or(u32::MAX),
                first: report
                    .imported
                    .iter()
                    .take(IMPORTED_NAMED)
                    .cloned()
                    .collect(),
            });
            let added = learning::learn(&report);
            if added > 0 {
                tracing::info!(
                    "the zygote learned {added} modules: its next generation imports them"
                );
            }
        }
        Err(e) => tracing::warn!("{} is not what a forked stage writes: {e}", path.display()),
    }
    Some(start)
}

/// `zygote`, or its next generation once that is ready (see [`promote_next`]); starts that
/// generation when its lineage learned something since `zygote` last looked.
fn advance(zygote: Zygote, at: Place<'_>, key: &Key<'_>, reaper: &Reaper) -> Zygote {
    if zygote.next.is_some() {
        return promote_next(zygote, at);
    }
    let mut zygote = zygote;
    if zygote.next_failed || !learning::enabled() || learning::changes() == zygote.seen {
        return zygote;
    }
    zygote.seen = learning::changes();
    if learning::load(&key.lineage).learned == zygote.learned {
        return zygote;
    }
    match start(key, zygote.env.clone(), reaper) {
        State::Starting(next) => zygote.next = Some(Box::new(next)),
        State::Serving(newer) => return succeeded_by(zygote, newer, at),
        State::Failed(_) => zygote.next_failed = true,
    }
    zygote
}

/// Where a zygote sits among a host's: its key in the map, and the host's standbys (which
/// follow it from one generation to the next).
#[derive(Clone, Copy)]
struct Place<'a> {
    key: u64,
    standbys: &'a Standbys,
}

/// `zygote`'s next generation in its place once that is ready ([`succeeded_by`]); `zygote`
/// itself while the next still imports, or with `next_failed` once the next failed. Starts
/// nothing.
fn promote_next(mut zygote: Zygote, at: Place<'_>) -> Zygote {
    let Some(next) = zygote.next.take() else {
        return zygote;
    };
    match ready(*next) {
        State::Starting(next) => zygote.next = Some(Box::new(next)),
        State::Serving(newer) => return succeeded_by(zygote, newer, at),
        State::Failed(why) => {
            tracing::warn!(
                "the zygote's next generation failed ({why}); generation {} serves on",
                zygote.generation
            );
            zygote.next_failed = true;
        }
    }
    zygote
}

/// Stops `old` (the stages it forked run on), which `newer` replaces; the standbys waiting
/// on `old` are replaced by standbys of `newer` under the same environments, so that the
/// stage after the change still begins as one.
fn succeeded_by(old: Zygote, mut newer: Zygote, at: Place<'_>) -> Zygote {
    let carried = at.standbys.carry_over(
        &standby_key(at.key, old.generation),
        &mut newer.server,
        &standby_key(at.key, newer.generation),
    );
    tracing::info!(
        "zygote generation {} ready ({} learned modules); generation {} stopped, {carried} of \
         its standbys readied again by the new one",
        newer.generation,
        newer.learned.len(),
        old.generation
    );
    stop_zygote(old);
    newer
}

fn stop_zygote(zygote: Zygote) {
    fork_server::stop(zygote.server);
    if let Some(next) = zygote.next {
        stop_starting(*next);
    }
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
    stop_zygote(zygote);
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
/// The learned modules it left out are kept as left out by its lineage.
fn ready(starting: Starting) -> State {
    let Some(reply) = starting.server.poll() else {
        return State::Starting(starting);
    };
    let Starting {
        server,
        env,
        lineage,
        generation,
        mut learned,
        seen,
        standby_for: _,
        graced: _,
    } = starting;
    match server.finish(reply) {
        Ok(server) => {
            tracing::debug!(
                pid = server.pid,
                generation,
                "zygote ready, its imports read {} variables",
                server.env_read.len()
            );
            let left_out = learning::leave_out(&lineage, &server.left_out);
            // As its lineage does: an entry under a module left out would import it again.
            learned.retain(|m| !left_out.iter().any(|l| learning::within(m, &l.module)));
            let read_ahead = server.read_ahead.clone();
            if let Some(ahead) = &read_ahead {
                // Kept as learned: the lineage's next zygotes import them too, and this one,
                // which holds them, is not replaced for them.
                learning::keep_read_ahead(&lineage, &ahead.modules);
                for module in &ahead.modules {
                    if !learned.contains(module) {
                        learned.push(module.clone());
                    }
                }
            }
            State::Serving(Zygote {
                server,
                env,
                generation,
                learned,
                left_out,
                read_ahead,
                seen,
                next: None,
                next_failed: false,
            })
        }
        Err(why) => failed(why),
    }
}

/// Readies a standby for each zygote that became ready since a stage with GPUs was exec'd
/// while it imported ([`Starting::standby_for`]), under that stage's environment: the stage
/// after it then starts as that standby (the first forked stage of a sweep included). And a
/// serving zygote whose next generation became ready is replaced by it now
/// ([`promote_next`]), its standbys readied again by the new one while the stages before the
/// next run. Cheap when there is neither: called while stages with `preload` run.
fn standbys_when_ready(standbys: &Standbys) {
    ZYGOTES.with(|zygotes| {
        let mut zygotes = zygotes.borrow_mut();
        let changing: Vec<u64> = (zygotes.iter())
            .filter(|(_, s)| match s {
                State::Starting(st) => st.standby_for.is_some(),
                State::Serving(z) => z.next.is_some(),
                State::Failed(_) => false,
            })
            .map(|(k, _)| *k)
            .collect();
        for key in changing {
            let state = match zygotes.remove(&key) {
                Some(State::Serving(zygote)) => {
                    State::Serving(promote_next(zygote, Place { key, standbys }))
                }
                Some(State::Starting(starting)) => standby_once_ready(starting, key, standbys),
                Some(failed) => failed,
                None => continue,
            };
            zygotes.insert(key, state);
        }
    });
}

/// `starting`'s state now; once it serves, a standby is asked of it under
/// [`Starting::standby_for`].
fn standby_once_ready(mut starting: Starting, key: u64, standbys: &Standbys) -> State {
    let env = starting.standby_for.take();
    match (ready(starting), env) {
        (State::Serving(mut zygote), Some(env)) => {
            let program = standby_key(key, zygote.generation);
            standbys.request(&mut zygote.server, &program, &env, true);
            State::Serving(zygote)
        }
        (State::Starting(mut starting), env) => {
            starting.standby_for = env;
            State::Starting(starting)
        }
        (other, _) => other,
    }
}

fn failed(why: ForkServerError) -> State {
    tracing::warn!("zygote unavailable: {why}; its Python stages are exec'd");
    State::Failed(Arc::new(why))
}

/// Stops every zygote of this process and waits until they are gone.
fn shutdown() {
    ZYGOTES.with(|z| {
        for (_, state) in z.borrow_mut().drain() {
            match state {
                State::Serving(zygote) => stop_zygote(zygote),
                State::Starting(starting) => stop_starting(starting),
                State::Failed(_) => {}
            }
        }
    });
}

/// Stops a zygote still starting, keeping what it found if it is ready by now: the learned
/// modules it left out are its lineage's from then on, even when no stage was forked from it
/// (a run that ends while its next generation finishes importing).
fn stop_starting(starting: Starting) {
    match ready(starting) {
        State::Starting(starting) => starting.server.stop(),
        State::Serving(zygote) => stop_zygote(zygote),
        State::Failed(_) => {}
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

/// Starts the zygote of `key` with `env`, in the background, as the generation its lineage
/// has learned; one with nothing to import is awaited up to [`BARE_WAIT`].
fn start(key: &Key<'_>, env: Vec<(String, String)>, reaper: &Reaper) -> State {
    let seen = learning::changes();
    let knowledge = learning::load(&key.lineage);
    learning::started(&key.lineage, knowledge.generation);
    let visible_gpus = (env.iter().rev())
        .find(|(k, _)| k == "CUDA_VISIBLE_DEVICES")
        .map(|(_, v)| v.split(',').filter(|e| !e.trim().is_empty()).count());
    // A zygote with nothing to import is awaited so that the first stage is forked and
    // teaches it: it reads nothing ahead, which would make it import.
    let bare = key.preload.modules().is_empty() && knowledge.learned.is_empty();
    let read_ahead = (learning::enabled() && !bare)
        .then(|| serde_json::json!({"argv": key.argv, "cwd": key.cwd}));
    let config = serde_json::json!({
        "preload": key.preload.modules(),
        "learned": knowledge.learned,
        "left_out": knowledge.left_out,
        "per_stage": {
            "prefixes": ["ORCHESTRATE_"],
            "names": protocol::worker::ENV_PORT_VARS.iter()
                .chain(&protocol::worker::ENV_FLIGHT_RECORDER_FILES)
                .collect::<Vec<_>>(),
        },
        "lineage": key.lineage,
        "generation": knowledge.generation,
        "visible_gpus": visible_gpus,
        "imports_var": if learning::enabled() { learning::IMPORTS_VAR } else { "" },
        "log": learning::log_path(&key.lineage),
        "read_ahead": read_ahead,
    });
    let mut cmd = Command::new(&key.interpreter);
    cmd.arg("-c")
        .arg(SOURCE)
        .arg("3")
        .arg(config.to_string())
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir("/");
    match fork_server::start_server_in_background(cmd, READY_TIMEOUT, reaper) {
        Ok(server) => {
            let starting = Starting {
                server,
                env,
                lineage: key.lineage.clone(),
                generation: knowledge.generation,
                learned: knowledge.learned,
                seen,
                standby_for: None,
                graced: false,
            };
            match bare {
                true => settle(starting, BARE_WAIT),
                false => State::Starting(starting),
            }
        }
        Err(why) => failed(why),
    }
}

/// `starting`'s state now, or, for the first stage that comes [`LATE_STAGE`] or more after it
/// started, once it is ready or [`LATE_GRACE`] has passed: this thread waits that once.
fn ready_or_late(mut starting: Starting) -> State {
    if starting.graced || starting.server.elapsed() < LATE_STAGE {
        return ready(starting);
    }
    starting.graced = true;
    settle(starting, LATE_GRACE)
}

/// `starting`'s state once it is ready or failed, or after `wait`.
fn settle(starting: Starting, wait: Duration) -> State {
    let deadline = std::time::Instant::now() + wait;
    let mut state = ready(starting);
    while let State::Starting(starting) = state {
        if std::time::Instant::now() >= deadline {
            return State::Starting(starting);
        }
        std::thread::sleep(Duration::from_millis(2));
        state = ready(starting);
    }
    state
}

/// A host's zygotes (one per interpreter and `preload`, each with its generations), as the
/// host holds them ([`crate::process::forkers::Forkers`]): they live in this thread's map,
/// which this value fronts; `enabled` is the `ORCHESTRATE_ZYGOTE` switch read at start-up.
///
/// Standbys: after a stage with GPUs is forked (or adopts a standby), the zygote forks a
/// standby under that stage's environment (`ORCHESTRATE_STANDBY`, as built-in workers'): a
/// stage's process-to-be that starts the CUDA driver (no context: nothing NVML lists) and
/// imports the modules the zygote leaves out for a thread (DeepSpeed), while the stages before
/// it run. The next stage of that zygote with the same driver variables adopts it instead of
/// being forked, under the rules and clean-up of `fork_server::standby`; the standby itself
/// refuses a stage for which a variable its imports read differs, or whose preloaded files
/// changed on disk, and the stage is then forked as usual.
pub struct Zygotes {
    enabled: bool,
    standbys: Standbys,
}

impl Zygotes {
    /// None started yet (a zygote starts with the first stage of its key); `standby`: whether
    /// standbys are readied.
    pub fn new(enabled: bool, standby: bool) -> Zygotes {
        Zygotes {
            enabled,
            standbys: Standbys::new(standby),
        }
    }

    /// Starts `stage` by forking it from its zygote; see the module's documentation. An error
    /// says why the caller should exec instead (zygotes switched off among them).
    pub fn spawn(&self, stage: &PythonStage<'_>, reaper: &Reaper) -> Result<Forked, Fallback> {
        if !self.enabled {
            return Err(Fallback::Disabled);
        }
        spawn(stage, reaper, &self.standbys)
    }

    /// Kills the waiting standbys whose environment sets `name` to `value` (see
    /// [`Standbys::stop_where`]).
    pub fn stop_standbys_where(&self, name: &str, value: &str) {
        self.standbys.stop_where(name, value);
    }

    /// Readies the standbys asked for while zygotes imported (see [`standbys_when_ready`]):
    /// to be called now and then while a stage with `preload` runs.
    pub fn standbys_when_ready(&self) {
        if self.enabled && self.standbys.enabled() {
            standbys_when_ready(&self.standbys);
        }
    }

    /// Stops every zygote and standby and waits until the zygotes are gone.
    pub fn shutdown(&self) {
        self.standbys.stop_all();
        shutdown();
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
        assert!(per_stage_variable("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"));
        assert!(!per_stage_variable("CUDA_VISIBLE_DEVICES"));
        assert!(!per_stage_variable("HF_HOME"));
    }

    /// The zygote's reading ahead, checked in its own Python: a script's top-level imports
    /// (in plain `if` and `try` blocks too, not in functions or classes), `from m import Name`
    /// as `m:Name`, what this process already holds, the user's own modules (beside the
    /// script, in the working directory) and modules left out passed over; a lazily provided
    /// name imported through attribute access.
    const READ_AHEAD_CHECK: &str = r#"
import os, sys
sys.path.insert(0, os.environ["ZYGOTE_DIR"])
import orchestrate_zygote as z
here = os.environ["SCRATCH"]
script = os.path.join(here, "scripts", "train.py")
assert z.script_imports(script) == [
    "os", "plainmod", "localmod", "cwdmod", "lazypkg:Model", "lazypkg:modeling", "gone",
    "json", "os.path:join", "threader"], z.script_imports(script)
named, lacks = z.read_ahead(["python3", "scripts/train.py"], here, [])
assert named == "scripts/train.py", named
assert lacks == ["plainmod", "lazypkg:Model", "lazypkg:modeling", "threader"], lacks
assert z.read_ahead(["python3", "scripts/train.py"], here, ["threader", "lazypkg"])[1] == ["plainmod"]
assert z.read_ahead(["python3", "-m", "plainmod"], here, [])[0] == "-m plainmod"
assert z.read_ahead(["python3", "-c", "1"], here, []) is None
request = {"argv": ["python3", "scripts/train.py"], "cwd": here}
assert z.lacks_for_fork(request, []) == lacks
follows = ["python3", "scripts/follows.py"]
got = z.read_ahead(follows, here, [])[1]
assert got == ["plainmod", "lazypkg:Model", "latermod", "threader"], got
got = z.lacks_for_fork({"argv": follows, "cwd": here}, [])
assert got == ["plainmod", "lazypkg:Model", "latermod", "threader"], got
with open(os.path.join(here, "scripts", "cyc_b.py"), "a") as cyc_b:
    cyc_b.write("import fractions\n")
got = z.lacks_for_fork({"argv": follows, "cwd": here}, [])
assert got == ["plainmod", "lazypkg:Model", "latermod", "fractions", "threader"], got
got = z.read_ahead(["python3", "scripts/relative.py"], here, [])[1]
assert got == ["plainmod", "latermod"], got
assert not {"helper", "cyc_a", "cyc_b", "upkg"} & set(sys.modules)
assert not z._held("lazypkg:Model")
z._import_entry("lazypkg:Model")
assert z._held("lazypkg:Model") and "lazypkg.modeling" in sys.modules
assert z._packages_then("a.b:C") == ["a", "a.b", "a.b:C"]
assert z._without(["a", "a.b:C", "ab", "a:D"], "a") == (["ab"], ["a.b:C", "a:D"])
print("ok")
"#;

    #[test]
    fn reading_ahead_takes_a_script_s_top_level_imports_but_not_the_user_s_own() {
        let s = e2e_tests::Scratch::new("zygote-read-ahead-unit");
        s.write("zygote/orchestrate_zygote.py", SOURCE);
        s.write("mods/plainmod.py", "X = 1\n");
        s.write("mods/threader.py", "X = 1\n");
        s.write(
            "mods/lazypkg/__init__.py",
            "def __getattr__(name):\n    from .modeling import Model\n    return Model\n",
        );
        s.write("mods/lazypkg/modeling.py", "class Model:\n    pass\n");
        s.write("scripts/localmod.py", "");
        s.write("cwdmod.py", "");
        s.write("mods/latermod.py", "X = 1\n");
        s.write("scripts/follows.py", "import os\nimport helper\n");
        s.write(
            "scripts/helper.py",
            "import plainmod\nfrom lazypkg import Model\nimport cyc_a\nimport os\n",
        );
        s.write("scripts/cyc_a.py", "import cyc_b\nimport threader\n");
        s.write(
            "scripts/cyc_b.py",
            "import cyc_a\nfrom helper import f\nimport latermod\n",
        );
        s.write("scripts/relative.py", "from upkg import thing\n");
        s.write(
            "scripts/upkg/__init__.py",
            "from .sub import y\nfrom . import other\n",
        );
        s.write("scripts/upkg/sub.py", "import plainmod\n");
        s.write("scripts/upkg/other.py", "import latermod\n");
        s.write(
            "scripts/train.py",
            "import os\nfrom . import sibling\nimport plainmod, localmod, cwdmod\n\
             from lazypkg import Model\nfrom lazypkg import modeling\nfrom __future__ import annotations\n\
             try:\n    import gone\nexcept ImportError:\n    import json\n\
             if True:\n    from os.path import join\nelse:\n    import threader\n\
             def f():\n    import decimal\nclass C:\n    import fractions\n",
        );
        let path = [
            s.path().join("mods"),
            s.path().to_path_buf(),
            s.path().join("scripts"),
        ];
        let out = Command::new("python3")
            .arg("-c")
            .arg(READ_AHEAD_CHECK)
            .env("PYTHONPATH", std::env::join_paths(path).unwrap())
            .env("ZYGOTE_DIR", s.path().join("zygote"))
            .env("SCRATCH", s.path())
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success() && out.stdout == b"ok\n",
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
