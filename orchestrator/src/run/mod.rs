//! Running a validated plan: its stages in dependency order, each attempt in a fresh process
//! tree, as many at once as `max_parallel` and the GPUs allow. The decisions are the
//! scheduler's (`scheduler`, no I/O); the run loop (`driver`) carries them out.
//!
//! Promises of [`run`]: stages start only after every upstream stage succeeded and its outputs were
//! verified; a GPU is given to one stage at a time; the journal gets a record at every state change
//! (fsynced as [`crate::store::journal`] says) and `report.json` is rewritten as attempts finish
//! (at most once a second, at most 0.2% of the time, and at the end); SIGINT/SIGTERM stop running
//! stages gracefully (a second one kills them); when it returns no stage process is alive.
//!
//! While a single stage runs, the stage that will start when it ends may be started by that
//! stage's own task at the point the run loop would have started it
//! (`crate::attempt::handover`); the run loop records such a start (journal, console, its
//! supervising task) when it learns of it, after the ending stage's own end record for a
//! chain's next stage.

mod driver;
mod early;
mod ending;
pub(crate) mod files;
mod lookahead;
pub(crate) mod placement;
pub mod preflight;
pub mod resume;
pub(crate) mod scheduler;
mod setup;
pub mod state;

use crate::attempt::launch::{CancelLevel, Services, TreeSampling};
use crate::error::{Context, Error, Result};
use crate::events::journal::{JournalSink, SharedJournal};
use crate::events::{Events, RunEvent};
use crate::host::Host;
use crate::plan::LoadedPlan;
use crate::report::stages::StageRecord;
use crate::run::resume::Decision;
use crate::run::state::StageState;
use crate::store::journal::Journal;
use crate::store::rundir::RunDir;
use protocol::status::RunStatus;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::Instrument;

/// What to run and where.
pub struct RunOptions {
    /// The validated plan.
    pub plan: LoadedPlan,
    /// The plan's source text, copied into the run directory.
    pub plan_source: String,
    /// The format of that text (kept as it is: `plan.toml` or `plan.json`).
    pub plan_format: crate::plan::PlanFormat,
    /// Where the run writes.
    pub run_dir: RunDir,
    /// Explicit `stage-worker` path (else the plan's `run.worker`, else beside `orchestrate`).
    pub worker: Option<PathBuf>,
    /// Where the run's events go (the console, the daemon's feed); the run adds its journal.
    pub events: Events,
    /// Continue the run already in `run_dir`: keep the stages that finished and still verify.
    pub resume: bool,
    /// Echo stages' output on the console.
    pub follow: bool,
    /// The first signal that asked the run to stop, and when (Unix time), as whoever maps
    /// signals to cancellation noted it: inside Slurm it decides the requeue.
    pub stop_signal: StopSignal,
}

/// A run's place among the runs of its host, given by whoever runs it on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The run's id among the host's runs (in stage tokens and GPU owner labels).
    pub run_id: String,
    /// Its place in the host's queue for GPUs ([`Host::ticket`]).
    pub ticket: crate::host::Ticket,
}

/// A signal that asked the run to stop, and when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StopBy {
    /// Its name ("SIGTERM").
    pub signal: &'static str,
    /// When it came, Unix time in seconds.
    pub at: f64,
}

/// Where the CLI notes the first stop signal (see [`RunOptions::stop_signal`]); clones share it.
#[derive(Debug, Clone, Default)]
pub struct StopSignal(Rc<std::cell::Cell<Option<StopBy>>>);

impl StopSignal {
    /// Notes `signal`, come at Unix time `at`, unless a signal was noted before.
    pub fn note(&self, signal: &'static str, at: f64) {
        if self.0.get().is_none() {
            self.0.set(Some(StopBy { signal, at }));
        }
    }

    /// The first signal noted, if any.
    pub fn first(&self) -> Option<StopBy> {
        self.0.get()
    }
}

/// How a run ended.
pub struct RunSummary {
    /// The exit status `orchestrate` should return.
    pub exit_code: i32,
    /// The run's status, as in its report.
    pub status: RunStatus,
    /// The human summary of the final report (which is in the run directory).
    pub summary: String,
}

/// Runs the plan to its end on `host`. `cancel` stops it: [`CancelLevel::Graceful`] gives
/// running stages SIGTERM and their grace, [`CancelLevel::Kill`] kills them now; no further
/// stage starts, and the run ends interrupted. Must be called inside the host's tokio
/// `LocalSet` on a current-thread runtime (the reaper and the stage tasks share the thread
/// that spawns stage processes, which `PR_SET_PDEATHSIG` ties the children's lives to).
///
/// Everything it logs is inside a `run` span (field `run`: the run's id), and what concerns
/// one attempt of a stage inside a `stage` span (fields `stage`, `attempt`) within it.
pub async fn run(
    opts: RunOptions,
    admission: Admission,
    host: &Rc<Host>,
    cancel: watch::Receiver<CancelLevel>,
) -> Result<RunSummary> {
    let span = tracing::info_span!(target: "orchestrate::run", "run", run = %admission.run_id);
    run_in_span(opts, admission, host, cancel)
        .instrument(span)
        .await
}

async fn run_in_span(
    opts: RunOptions,
    Admission { run_id, ticket }: Admission,
    host: &Rc<Host>,
    mut cancel: watch::Receiver<CancelLevel>,
) -> Result<RunSummary> {
    let RunOptions {
        plan,
        plan_source,
        plan_format,
        run_dir,
        worker,
        events,
        resume,
        follow,
        stop_signal,
    } = opts;
    // Shared with the thread that writes the run's files while the first stages run.
    let plan = Arc::new(plan);
    // Slurm: the job this run belongs to (the host's); stages run through srun need one.
    let placement =
        placement::Placement::new(host.allocation.clone(), run_dir.root(), &host.settings);
    let cleared = preflight::check(&plan, host, placement.allocation()).map_err(Error::from)?;
    let needs_worker = plan.plan.stages.iter().any(|s| s.kind.is_some());
    let worker = match needs_worker {
        true => Some(crate::attempt::prepare::resolve_worker(
            worker.as_deref(),
            &plan,
        )?),
        false => None,
    };
    if let Some(note) = &host.gpu_note {
        events.note(note);
    }
    events.note(&gpu_check_note(&plan, &cleared));
    for line in &cleared.limit_notes {
        events.note(line);
    }
    let cgroups = run_cgroup(&cleared, &run_id, &events)?;

    // The run directory's fixed files.
    run_dir.record_plan(&plan_source, plan_format, &plan.source_name, &plan.base_dir)?;
    // Kept, it would be held for the whole run (a long written-out plan's text is megabytes).
    drop(plan_source);
    let fingerprints = crate::plan::fingerprint::Background::start(plan.clone());
    let decisions = match resume {
        true => Some(resume_decisions(&plan, &run_dir, &fingerprints, &events, &mut cancel).await?),
        false => None,
    };
    let journal = Journal::open(&run_dir.journal_path())
        .with_context(|| format!("cannot open the journal in {}", run_dir.root().display()))?;
    let journal = SharedJournal::new(journal);
    let events = events.with(JournalSink::new(journal.clone()));
    events.emit(RunEvent::RunStarted {
        plan: plan.source_name.clone(),
        pid: std::process::id(),
        gpu_check: cleared.gpu_check.clone(),
        resumed: resume,
    })?;
    events.note(&format!("run directory: {}", run_dir.root().display()));
    events.emit(RunEvent::RunPlanned {
        stages: plan.plan.stages.len(),
    })?;
    placement.begin(&journal, &events, &host.reaper).await?;
    let (states, records) = initial_states(&plan, decisions.as_deref(), &run_dir)?;
    let report = crate::report::stages::StageBook::new(plan.clone(), records);
    let events = events.with(report.sink());
    let settings = &plan.plan.run;
    let services = Rc::new(Services {
        reaper: host.reaper.clone(),
        probe: cleared.probe.clone(),
        tolerance_bytes: settings.gpu_tolerance_mib.saturating_mul(1 << 20),
        reclaim_timeout: settings.reclaim_timeout.get(),
        events: events.clone(),
        follow,
        run_id: run_id.clone(),
        tree_sampling: TreeSampling::start(),
        cgroups,
        forkers: host.forkers.clone(),
        mps: host.mps.clone(),
        hand_on_at_release: host.settings.hand_on_at_release,
    });
    let setup = setup::Setup {
        plan: plan.clone(),
        run_dir,
        worker,
        events,
        resume,
        run_id,
        ticket,
        placement,
        cleared,
        journal,
        services,
        fingerprints,
        report,
    };
    driver::drive(setup, states, host, cancel, stop_signal).await
}

/// The run's cgroup, where the host lets stages have one (see [`crate::process::cgroup`]);
/// said on the console either way. An error only when limits need it and it cannot be made.
fn run_cgroup(
    cleared: &preflight::Cleared,
    run_id: &str,
    events: &Events,
) -> Result<Option<Rc<crate::process::cgroup::RunCgroup>>> {
    let host = &cleared.cgroups;
    let Some(own) = host.own.as_deref().filter(|_| host.usable()) else {
        events.note(&format!("isolation: process groups ({})", host.describe()));
        return Ok(None);
    };
    crate::process::cgroup::sweep_stale(own);
    let name = format!(
        "orchestrate-{}-{}",
        std::process::id(),
        run_id
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            })
            .take(64)
            .collect::<String>()
    );
    let namespaced = host.stage_namespaces();
    match crate::process::cgroup::RunCgroup::create(own, &name, &cleared.controllers, namespaced) {
        Ok(run) => {
            let limits = match cleared.controllers.is_empty() {
                true => String::new(),
                false => format!("; limits with {}", cleared.controllers.join(", ")),
            };
            events.note(&format!(
                "isolation: a cgroup per stage under {}{limits}; {}",
                run.path().display(),
                host.describe_namespaces()
            ));
            Ok(Some(Rc::new(run)))
        }
        Err(e) if cleared.controllers.is_empty() => {
            events.note(&format!("isolation: process groups ({e})"));
            Ok(None)
        }
        Err(e) => Err(Error::Refused(format!(
            "the stages' limits need a cgroup of the run's, which cannot be made: {e}"
        ))),
    }
}

/// How the run's GPUs are checked, for the console.
fn gpu_check_note(plan: &LoadedPlan, cleared: &preflight::Cleared) -> String {
    let gpu_check = &cleared.gpu_check;
    if cleared.no_driver {
        return crate::gpu::NO_DRIVER_NOTE.to_string();
    }
    if cleared.gpus.is_empty() && plan.plan.stages.iter().any(|s| s.gpus_wanted() > 0) {
        format!("GPU check: {gpu_check}; no GPU found: stages that ask for GPUs run on the CPU")
    } else {
        format!("GPU check: {gpu_check}")
    }
}

/// What a resumed run keeps of the run in `run_dir`, per stage. Verifying kept outputs
/// re-reads every checkpoint: off this thread, which other runs of the same host (the
/// daemon's) share, and given up at once when the run is stopped (the stop then applies
/// before any stage starts).
async fn resume_decisions(
    plan: &Arc<LoadedPlan>,
    run_dir: &RunDir,
    fingerprints: &crate::plan::fingerprint::Background,
    events: &Events,
    cancel: &mut watch::Receiver<CancelLevel>,
) -> Result<Vec<Decision>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let path = run_dir.journal_path();
    if crate::store::journal::repair_tail(&path)
        .with_context(|| format!("cannot repair {}", path.display()))?
    {
        events.warn("the journal's last line was torn (a crash mid-write); it was cut off");
    }
    let records = crate::store::journal::read_run_journal(run_dir.root())?;
    let (for_thread, prints) = (plan.clone(), fingerprints.clone());
    let abort = Arc::new(AtomicBool::new(false));
    let flag = abort.clone();
    let mut work = tokio::task::spawn_blocking(move || {
        crate::run::resume::decide_until(&for_thread, &prints.all(), &records, &flag)
    });
    let mut listening = true;
    let decisions = loop {
        tokio::select! {
            done = &mut work => break done,
            changed = cancel.changed(), if listening => match changed {
                Err(_) => listening = false,
                Ok(()) if *cancel.borrow() != CancelLevel::None => {
                    abort.store(true, Ordering::Relaxed)
                }
                Ok(()) => {}
            },
        }
    }
    .map_err(|e| Error::Internal(format!("the resume check stopped: {e}")))?;
    events.detail(&format!(
        "resuming {}:\n{}",
        run_dir.root().display(),
        crate::run::resume::render(plan, &decisions)
    ));
    Ok(decisions)
}

/// Every stage's state as the run begins, the scheduler's and the report's: pending, or kept
/// as a resume decided (a stage run again whose old outputs must go has them removed now).
fn initial_states(
    plan: &LoadedPlan,
    decisions: Option<&[Decision]>,
    run_dir: &RunDir,
) -> Result<(Vec<StageState>, Vec<StageRecord>)> {
    let n = plan.plan.stages.len();
    let (mut states, mut records) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for (i, stage) in plan.plan.stages.iter().enumerate() {
        let (state, record) = match decisions.map(|d| &d[i]) {
            Some(Decision::Keep {
                attempts,
                checkpoints,
                metrics,
                wall_s,
            }) => (
                StageState {
                    status: state::Status::Succeeded,
                    attempts: *attempts,
                },
                StageRecord::kept(
                    *attempts,
                    checkpoints.clone(),
                    metrics.clone(),
                    Duration::from_secs_f64(wall_s.unwrap_or(0.0).max(0.0)),
                ),
            ),
            Some(Decision::Run {
                attempts,
                clear_output,
                ..
            }) => {
                if *clear_output {
                    let dir = run_dir.output_dir(&stage.name);
                    if dir.exists() {
                        std::fs::remove_dir_all(&dir)
                            .with_context(|| format!("cannot clear {}", dir.display()))?;
                    }
                }
                (
                    StageState::pending(*attempts),
                    StageRecord::pending(*attempts),
                )
            }
            None => (StageState::pending(0), StageRecord::pending(0)),
        };
        states.push(state);
        records.push(record);
    }
    Ok((states, records))
}
