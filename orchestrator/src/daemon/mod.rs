//! `orchestrate daemon`: one [`Host`] and many runs, plans submitted over a Unix socket.
//!
//! - [`socket`]: where the socket is, how it is created (0600, stale socket replaced, a live
//!   daemon refused), who may connect (`SO_PEERCRED`: the same user or root);
//! - `runs_lock`: the daemon's exclusive hold on its runs directory;
//! - `registry`: the runs, their event logs and watchers;
//! - `event_log`: a run's event log read back in bounded pieces, for watchers that replay it;
//! - `recover`: the runs a starting daemon finds, listed or resumed;
//! - `connection`: one client's requests, with a size cap and an idle timeout, so a slow or
//!   hostile client costs the others nothing.
//!
//! Runs share the host's GPU pool and CPU budget; each is driven by
//! [`run::run`](crate::run::run) like a CLI run, its console a silent tap into the
//! registry. On start the daemon takes its runs directory for itself and recovers its runs from
//! their directories under `--runs-dir`: finished ones as history, the ones the daemon's end
//! interrupted (a crash, or its own shutdown) resumed by the resume rules.

pub mod client;
pub(crate) mod connection;
pub(crate) mod event_log;
pub(crate) mod recover;
pub(crate) mod registry;
pub(crate) mod request_budget;
pub(crate) mod runs_lock;
pub mod socket;
pub(crate) mod strict_json;
pub mod tally;

use crate::attempt::launch::CancelLevel;
use crate::host::Host;
use crate::plan::{LoadedPlan, PlanFormat};
use crate::store::rundir::RunDir;
use protocol::daemon::{PlanInput, ShutdownMode};
use registry::{Registry, RunEntry, Submission, STOPPED_FILE, SUBMISSION_FILE};
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

/// How the daemon is set up.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The socket.
    pub socket: PathBuf,
    /// Where run directories go (and are recovered from).
    pub runs_dir: PathBuf,
    /// A connection that sends no complete request for this long is closed.
    pub idle_timeout: Duration,
    /// The stage-worker binary, if not the default.
    pub worker: Option<PathBuf>,
}

/// The per-user default directory of the daemon's runs: `$XDG_STATE_HOME/orchestrate/runs`,
/// or `~/.local/state/orchestrate/runs`.
pub fn default_runs_dir() -> PathBuf {
    if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|s| !s.is_empty()) {
        return PathBuf::from(state).join("orchestrate").join("runs");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".local/state/orchestrate/runs")
}

/// What every connection shares.
pub struct Daemon {
    /// The host.
    pub host: Rc<Host>,
    /// The runs.
    pub registry: RefCell<Registry>,
    /// The set-up.
    pub config: DaemonConfig,
    /// No new runs are taken.
    pub shutting_down: Cell<bool>,
    /// Woken when a run ends or a shutdown is asked for.
    pub changed: tokio::sync::Notify,
    /// Open connections.
    pub connections: Cell<usize>,
    /// What the connections' unfinished requests hold, all together.
    pub request_budget: request_budget::RequestBudget,
    /// What the daemon counts from the runs' events (`/metrics` shows it).
    pub tally: RefCell<tally::Tally>,
}

/// Why the daemon could not take a plan, start a run or resume one.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DaemonError {
    /// The plan does not validate (or cannot be read); the report, for the client.
    #[error("{}", .0.to_string().trim_end())]
    InvalidPlan(#[source] crate::plan::PlanError),
    /// The submission's `base_dir` is missing or not a directory.
    #[error("base_dir {path}: {why}: give the directory the plan's stages run in and its relative paths start from")]
    BaseDir {
        /// The directory, as the daemon resolved it.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// Reading the plan stopped without an answer (its thread panicked).
    #[error("the plan could not be read: {0}")]
    PlanUnread(#[source] tokio::task::JoinError),
    /// The run directory could not be made, opened or read.
    #[error(transparent)]
    RunDir(#[from] crate::store::rundir::RunDirError),
    /// The run's submission record could not be encoded.
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
    /// The run's submission record could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
}

/// A plan ready to run: validated, with the text and format the run directory keeps.
pub(crate) struct Accepted {
    loaded: LoadedPlan,
    source: String,
    format: PlanFormat,
}

/// Reads and validates a submitted plan (on a blocking thread: a big plan must not stall the
/// runs). `Err` is the validation report, for the client.
pub(crate) async fn accept_plan(
    input: PlanInput,
    base_dir: Option<String>,
) -> Result<Accepted, DaemonError> {
    tokio::task::spawn_blocking(move || {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let base = base_dir.map(PathBuf::from).unwrap_or_else(|| cwd.clone());
        let base = cwd.join(base);
        if !matches!(input, PlanInput::Path(_)) {
            check_base_dir(&base)?;
        }
        let (loaded, source, format) = match input {
            PlanInput::Toml(text) => (
                crate::plan::parse_plan_toml(&text, "<submitted plan>", &base),
                text,
                PlanFormat::Toml,
            ),
            PlanInput::Json(value) => {
                let text = serde_json::to_string_pretty(&value).unwrap_or_default();
                (
                    crate::plan::parse_plan_json(&text, "<submitted plan>", &base),
                    text,
                    PlanFormat::Json,
                )
            }
            PlanInput::Path(path) => {
                let path = cwd.join(path);
                let format = crate::plan::format_of(&path);
                return crate::plan::read_plan(&path)
                    .map(|(loaded, source)| Accepted {
                        loaded,
                        source,
                        format,
                    })
                    .map_err(DaemonError::InvalidPlan);
            }
        };
        loaded
            .map(|loaded| Accepted {
                loaded,
                source,
                format,
            })
            .map_err(DaemonError::InvalidPlan)
    })
    .await
    .unwrap_or_else(|e| Err(DaemonError::PlanUnread(e)))
}

/// A submission's base directory exists and is a directory (its stages start there).
fn check_base_dir(base: &Path) -> Result<(), DaemonError> {
    let why = match std::fs::metadata(base) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(meta) => format!(
            "it is {}",
            crate::store::user_file::non_regular_kind(&meta).unwrap_or("a file")
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "it does not exist".into(),
        Err(e) => format!("it cannot be read: {e}"),
    };
    Err(DaemonError::BaseDir {
        path: base.to_path_buf(),
        why,
    })
}

impl Daemon {
    /// Whether a validated plan can run on this daemon's host (the check every run makes
    /// before its first stage), so that a plan that cannot is refused in the answer to its
    /// `submit` rather than accepted and then failed.
    pub(crate) fn preflight(&self, plan: &Accepted) -> Result<(), crate::run::preflight::Refusal> {
        let job = crate::slurm::Allocation::detect();
        crate::run::preflight::check(&plan.loaded, &self.host, job.as_ref()).map(|_| ())
    }

    /// Starts a validated plan as a new run; returns its id and directory.
    pub(crate) fn start_run(
        self: &Rc<Self>,
        plan: Accepted,
        client_id: Option<String>,
        priority: i32,
    ) -> Result<(String, PathBuf), DaemonError> {
        let name = plan
            .loaded
            .plan
            .run
            .name
            .clone()
            .unwrap_or_else(|| "run".into());
        // The directory's name is the run's id: one no run of this daemon has, even one whose
        // directory is gone from the runs directory (moved away while the daemon runs).
        let registry = &self.registry;
        let run_dir = RunDir::create_fresh_avoiding(&self.config.runs_dir, &name, |id| {
            registry.borrow().contains(id)
        })?;
        let id = run_dir
            .root()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let submission = Submission {
            id: id.clone(),
            client_id,
            priority,
            submitted_unix: crate::timefmt::unix_secs_f64(),
            stages: plan.loaded.plan.stages.len(),
        };
        let path = run_dir.root().join(SUBMISSION_FILE);
        let bytes = serde_json::to_vec_pretty(&submission)?;
        if let Err(source) = crate::store::rundir::write_atomic(&path, &bytes) {
            return Err(DaemonError::Write { path, source });
        }
        let root = run_dir.root().to_path_buf();
        self.registry
            .borrow_mut()
            .insert(RunEntry::new(submission, root.clone()));
        self.spawn_run(id.clone(), plan, run_dir, false, priority);
        tracing::info!(run = %id, dir = %root.display(), "run submitted");
        Ok((id, root))
    }

    fn spawn_run(
        self: &Rc<Self>,
        id: String,
        plan: Accepted,
        run_dir: RunDir,
        resume: bool,
        priority: i32,
    ) {
        let daemon = self.clone();
        let cancel = self
            .registry
            .borrow()
            .get(&id)
            .map(|e| e.cancel.subscribe())
            .expect("the run was just registered");
        let (tap, mut events) = tokio::sync::mpsc::unbounded_channel();
        let options = crate::run::RunOptions {
            plan: plan.loaded,
            plan_source: plan.source,
            plan_format: plan.format,
            run_dir,
            worker: self.config.worker.clone(),
            events: crate::events::Events::new().with(crate::events::tap::TapSink::new(tap)),
            resume,
            follow: false,
            stop_signal: Default::default(),
        };
        let admission = crate::run::Admission {
            run_id: id.clone(),
            ticket: self.host.ticket(priority),
        };
        tokio::task::spawn_local(async move {
            let pump = {
                let daemon = daemon.clone();
                let id = id.clone();
                async move {
                    while let Some(event) = events.recv().await {
                        daemon.tally.borrow_mut().record(&id, &event);
                        if let Some(entry) = daemon.registry.borrow_mut().get_mut(&id) {
                            entry.push(event);
                        }
                    }
                }
            };
            let (result, ()) = tokio::join!(
                crate::run::run(options, admission, &daemon.host, cancel),
                pump
            );
            let (state, code) = match result {
                Ok(summary) => (summary.status, summary.exit_code),
                Err(e) => {
                    tracing::warn!(run = %id, "the run could not be carried on: {e:#}");
                    if let Some(entry) = daemon.registry.borrow_mut().get_mut(&id) {
                        entry.push(protocol::daemon::RunEvent {
                            t_ms: crate::timefmt::unix_ms(),
                            kind: protocol::daemon::RunEventKind::Warning {
                                text: format!("error: {e:#}"),
                            },
                        });
                    }
                    (protocol::status::RunStatus::Failed, crate::exit::RUN_ERROR)
                }
            };
            if let Some(entry) = daemon.registry.borrow_mut().get_mut(&id) {
                entry.finish(state, code);
            }
            tracing::info!(run = %id, state = %state, exit_code = code, "run finished");
            daemon.changed.notify_waiters();
        });
    }

    fn resume_run(&self, dir: &Path) -> Result<(Accepted, RunDir), DaemonError> {
        let run_dir = RunDir::open_existing(dir)?;
        let (path, format, base) = crate::store::rundir::run_plan_location(run_dir.root())?;
        let (loaded, source) =
            crate::plan::load_plan_based(&path, format, &base).map_err(DaemonError::InvalidPlan)?;
        Ok((
            Accepted {
                loaded,
                source,
                format,
            },
            run_dir,
        ))
    }

    /// Stops taking runs; `Cancel` also stops the running ones gracefully. A run this stops
    /// is marked on disk first (`stopped-by-daemon`), so the next daemon resumes it as it
    /// resumes a run whose daemon was killed; a run a user already cancelled is not marked.
    pub fn shutdown(&self, mode: ShutdownMode) -> usize {
        self.shutting_down.set(true);
        if mode == ShutdownMode::Cancel {
            let mut registry = self.registry.borrow_mut();
            let ids: Vec<String> = registry
                .all()
                .filter(|r| !r.finished())
                .map(|r| r.submission.id.clone())
                .collect();
            for id in ids {
                let Some(run) = registry.get_mut(&id) else {
                    continue;
                };
                if *run.cancel.borrow() == CancelLevel::None && !run.stopped_by_daemon() {
                    let mark = run.run_dir.join(STOPPED_FILE);
                    match crate::store::rundir::write_atomic(
                        &mark,
                        b"stopped by the daemon's shutdown; the next daemon resumes this run\n",
                    ) {
                        Ok(()) => run.mark_stopped_by_daemon(),
                        Err(e) => {
                            tracing::warn!(run = %id, "cannot write {}: {e}; the run will not be resumed by the next daemon", mark.display())
                        }
                    }
                }
                run.cancel.send_replace(CancelLevel::Graceful);
            }
        }
        self.changed.notify_waiters();
        self.registry.borrow().running()
    }
}

/// Runs the daemon until it is shut down (a `shutdown` request, SIGINT or SIGTERM, which
/// stop running runs gracefully: they resume when the daemon starts again). Refuses to start
/// when another daemon owns the runs directory or serves the socket. Once its runs are
/// recovered, `beside` starts what serves beside the socket (the web view), with a handle to
/// the daemon; what it returns is kept until the daemon stops, and its error (a message for
/// the user) refuses the start.
pub async fn serve<B>(
    config: DaemonConfig,
    beside: impl FnOnce(Rc<Daemon>) -> Result<B, String>,
) -> crate::error::Result<()> {
    use crate::error::Context;
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    // A daemon is not tied to a terminal: a hangup does not stop it.
    let mut sighup = signal(SignalKind::hangup())?;
    std::fs::create_dir_all(&config.runs_dir)
        .with_context(|| format!("cannot create {}", config.runs_dir.display()))?;
    let config = DaemonConfig {
        runs_dir: std::fs::canonicalize(&config.runs_dir)
            .with_context(|| format!("cannot resolve {}", config.runs_dir.display()))?,
        ..config
    };
    // Every connection, log and stage pipe is a descriptor: take all the system allows, so
    // that a common soft limit of 1,024 is not what refuses the owner's next connection.
    match crate::host::descriptors::raise_nofile_limit() {
        Ok((before, after)) if before < after => tracing::info!(
            "open files limit (soft RLIMIT_NOFILE) raised from {before} to {after}, the hard limit"
        ),
        Ok((_, after)) => {
            tracing::info!("open files limit (soft RLIMIT_NOFILE): {after}, the hard limit")
        }
        Err(e) => tracing::warn!("cannot raise the open files limit: {e}"),
    }
    let runs_lock = runs_lock::RunsDirLock::acquire(&config.runs_dir)?;
    let listening = socket::listen(&config.socket)?;
    let listener = tokio::net::UnixListener::from_std(listening.listener.try_clone()?)?;
    let host = Host::start(crate::settings::Settings::from_env())?;
    let daemon = Rc::new(Daemon {
        host,
        registry: RefCell::new(Registry::default()),
        config,
        shutting_down: Cell::new(false),
        changed: tokio::sync::Notify::new(),
        connections: Cell::new(0),
        request_budget: request_budget::RequestBudget::new(
            protocol::daemon::MAX_BUFFERED_REQUEST_BYTES,
        ),
        tally: RefCell::default(),
    });
    daemon.recover();
    let beside = beside(daemon.clone()).map_err(crate::error::Error::Refused)?;
    tracing::info!(
        socket = %listening.path.display(),
        runs_dir = %daemon.config.runs_dir.display(),
        pid = std::process::id(),
        "daemon listening"
    );
    eprintln!(
        "orchestrate daemon: listening on {} (runs in {})",
        listening.path.display(),
        daemon.config.runs_dir.display()
    );
    let mut accept_errors = crate::host::descriptors::AcceptErrors::default();
    loop {
        if daemon.shutting_down.get() && daemon.registry.borrow().running() == 0 {
            break;
        }
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    accept_errors.accepted("daemon socket");
                    let daemon = daemon.clone();
                    tokio::task::spawn_local(connection::serve(daemon, stream));
                }
                // Out of descriptors the connection waits in the backlog: a short pause (the
                // other tasks run on), then again; never a spin, never a stop.
                Err(e) => accept_errors.failed("daemon socket", &e).await,
            },
            _ = daemon.changed.notified() => {}
            _ = sigint.recv() => { daemon.shutdown(ShutdownMode::Cancel); }
            _ = sigterm.recv() => { daemon.shutdown(ShutdownMode::Cancel); }
            _ = sighup.recv() => {}
        }
    }
    tracing::info!("daemon stopped");
    drop(beside);
    drop(listening);
    drop(runs_lock);
    Ok(())
}
