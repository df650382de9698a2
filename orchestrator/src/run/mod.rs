//! The scheduler: runs a validated plan's stages in dependency order, each attempt in a fresh
//! process tree, as many at once as `max_parallel` and the GPUs allow.
//!
//! Promises of [`run`]: stages start only after every upstream stage succeeded and its outputs
//! were verified; a GPU is given to one stage at a time; the journal gets a record at every
//! state change (fsynced as [`crate::store::journal`] says) and `report.json` is rewritten as attempts
//! finish (at most once a second, at most 0.2% of the time, and at the end); SIGINT/SIGTERM stop
//! running stages gracefully (a second one kills them); when it returns no stage process is
//! alive.
//!
//! While a single stage runs, the stage that will start when it ends may be started by that
//! stage's own task at the point the runner would have started it (`crate::attempt::handover`); the
//! runner records such a start (journal, console, its supervising task) when it learns of it,
//! after the ending stage's own end record for a chain's next stage.

pub(crate) mod files;
pub mod state;

use crate::attempt::handover::{self, NextUp, Started, Successor};
use crate::attempt::supervise::{self as stage, AttemptResult, CancelLevel, Outcome, Services};
use crate::error::{Context, Error, Result};
use crate::exit;
use crate::gpu::{self, GpuInfo, MemoryProbe};
use crate::host::Host;
use crate::plan::LoadedPlan;
use crate::report::console::Console;
use crate::report::Snapshot;
use crate::run::state::{LastAttempt, StageState, Status};
use crate::store::journal::{Journal, JournalRecord};
use crate::store::rundir::{write_replace, RunDir};
use protocol::plan::{GpuCheck, OnLeak};
use protocol::status::{FailureClass, RunStatus, StageStatus};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

/// The preparer gets the next ready stages when one of the next `PREPARE_LOW + 1` has no files...
const PREPARE_LOW: usize = 2;
/// ...and up to this many of them at a time (each opened one holds three descriptors, which
/// every spawn copies into its child until `execve` closes them).
const PREPARE_BATCH: usize = 8;

/// What a running stage tells the run.
enum StageNews {
    /// Stage `i` gave its slot back early (its tree is gone; its result follows).
    Freed(usize),
    /// Stage `i` gave its slot to its planned successor, which it started (see
    /// [`crate::attempt::handover`]; its result follows).
    HandedOver(usize, Started),
    /// Stage `i`'s attempt ended: its result, the GPUs it held, and the successor it started
    /// when it succeeded ([`handover::Kind::Chain`]).
    Done(usize, Box<AttemptResult>, Vec<GpuInfo>, Option<Started>),
}

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
    /// Progress display.
    pub console: Console,
    /// Continue the run already in `run_dir`: keep the stages that finished and still verify.
    pub resume: bool,
    /// Echo stages' output on the console.
    pub follow: bool,
    /// The run's id among the host's runs (in stage tokens and GPU owner labels).
    pub run_id: String,
    /// Its place in the host's queue for GPUs.
    pub ticket: crate::host::Ticket,
    /// The first signal that asked the run to stop, and when (Unix time), as whoever maps
    /// signals to cancellation noted it: inside Slurm it decides the requeue.
    pub stop_signal: StopSignal,
}

/// Where the CLI notes the first stop signal (see [`RunOptions::stop_signal`]).
pub type StopSignal = Rc<std::cell::Cell<Option<(&'static str, f64)>>>;

/// How a run ended.
pub struct RunSummary {
    /// The exit status `orchestrate` should return.
    pub exit_code: i32,
    /// The run's status, as in its report.
    pub status: RunStatus,
    /// The human summary of the final report (which is in the run directory).
    pub summary: String,
}

fn retry_backoff(attempt: u32) -> Duration {
    Duration::from_millis(500u64.saturating_mul(1 << attempt.min(6).saturating_sub(1)))
        .min(Duration::from_secs(30))
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
    host: &Rc<Host>,
    cancel: watch::Receiver<CancelLevel>,
) -> Result<RunSummary> {
    let span = tracing::info_span!(target: "orchestrate::run", "run", run = %opts.run_id);
    run_in_span(opts, host, cancel).instrument(span).await
}

async fn run_in_span(
    opts: RunOptions,
    host: &Rc<Host>,
    mut cancel: watch::Receiver<CancelLevel>,
) -> Result<RunSummary> {
    let RunOptions {
        plan,
        plan_source,
        plan_format,
        run_dir,
        worker,
        console,
        resume,
        follow,
        run_id,
        ticket,
        stop_signal,
    } = opts;
    // Shared with the thread that writes the run's files while the first stages run.
    let plan = std::sync::Arc::new(plan);
    let settings = plan.plan.run.clone();
    let stages = &plan.plan.stages;
    // Slurm: the job this run belongs to; stages run through srun need one (see `slurm`).
    let slurm = crate::slurm::Allocation::detect();
    if let Err(why) = crate::slurm::srun::check_plan(stages, slurm.as_ref()) {
        return Err(why.into());
    }
    let needs_worker = stages.iter().any(|s| s.kind.is_some());
    let worker = if needs_worker {
        Some(crate::attempt::prepare::resolve_worker(
            worker.as_deref(),
            &plan,
        )?)
    } else {
        None
    };

    // GPUs: the host's inventory always (for assignment by UUID); the probe only when
    // checking.
    let gpus: Vec<GpuInfo> = host.gpus().to_vec();
    let (probe, gpu_check): (Option<Rc<dyn MemoryProbe>>, String) = match (
        &host.inventory.status,
        settings.gpu_check,
    ) {
        (_, GpuCheck::Off) => (None, "off (gpu_check = \"off\")".to_string()),
        (Ok(driver), _) => (
            host.inventory.probe.clone(),
            format!(
                "verified with NVML (driver {driver}, {} GPU(s))",
                gpus.len()
            ),
        ),
        (Err(why), GpuCheck::Required) => {
            return Err(Error::Refused(format!("the plan sets gpu_check = \"required\" but {why}; run on a machine with an NVIDIA driver, or set gpu_check = \"auto\"")))
        }
        (Err(why), _) => (None, format!("unavailable: {why}")),
    };
    if let Some(note) = &host.gpu_note {
        console.note(note);
    }
    if settings.gpu_check == GpuCheck::Required && gpus.is_empty() {
        return Err(Error::Refused(
            "the plan sets gpu_check = \"required\" but NVML lists no GPU on this machine".into(),
        ));
    }
    let machine_has_gpus = !gpus.is_empty();
    for s in stages {
        if machine_has_gpus && s.gpus_wanted() as usize > gpus.len() {
            return Err(Error::Refused(format!(
                "stage `{}` asks for {} GPUs but this machine has {}",
                s.name,
                s.gpus_wanted(),
                gpus.len()
            )));
        }
    }
    if !machine_has_gpus && stages.iter().any(|s| s.gpus_wanted() > 0) {
        console.note(&format!(
            "GPU check: {gpu_check}; no GPU found: stages that ask for GPUs run on the CPU"
        ));
    } else {
        console.note(&format!("GPU check: {gpu_check}"));
    }

    // The run directory's fixed files.
    run_dir.record_plan(&plan_source, plan_format, &plan.source_name, &plan.base_dir)?;
    let fingerprints = crate::store::fingerprint::Background::start(plan.clone());
    let decisions = if resume {
        let path = run_dir.journal_path();
        if crate::store::journal::repair_tail(&path)
            .with_context(|| format!("cannot repair {}", path.display()))?
        {
            console.warn("the journal's last line was torn (a crash mid-write); it was cut off");
        }
        let records = crate::store::journal::read_run_journal(run_dir.root())?;
        // Verifying kept outputs re-reads every checkpoint: off this thread, which other runs
        // of the same host (the daemon's) share, and given up at once when the run is stopped
        // (the stop then applies before any stage starts).
        let decisions = {
            use std::sync::atomic::{AtomicBool, Ordering};
            let plan = plan.clone();
            let prints = fingerprints.clone();
            let abort = std::sync::Arc::new(AtomicBool::new(false));
            let flag = abort.clone();
            let mut work = tokio::task::spawn_blocking(move || {
                crate::store::resume::decide_until(&plan, &prints.all(), &records, &flag)
            });
            let mut listening = true;
            loop {
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
            .map_err(|e| Error::Internal(format!("the resume check stopped: {e}")))?
        };
        console.detail(&format!(
            "resuming {}:\n{}",
            run_dir.root().display(),
            crate::store::resume::render(&plan, &decisions)
        ));
        Some(decisions)
    } else {
        None
    };
    let mut journal = Journal::open(&run_dir.journal_path())
        .with_context(|| format!("cannot open the journal in {}", run_dir.root().display()))?;
    journal.append(&JournalRecord::RunStarted {
        plan: plan.source_name.clone(),
        pid: std::process::id(),
        gpu_check: gpu_check.clone(),
        resumed: resume,
    })?;
    console.note(&format!("run directory: {}", run_dir.root().display()));
    console.plan_size(stages.len());
    if let Some(job) = &slurm {
        console.note(&job.describe());
        crate::slurm::history::record_start(run_dir.root(), job, &mut journal)?;
    }

    let services = Rc::new(Services {
        reaper: host.reaper.clone(),
        probe,
        tolerance_bytes: settings.gpu_tolerance_mib.saturating_mul(1 << 20),
        reclaim_timeout: settings.reclaim_timeout.get(),
        console: console.clone(),
        follow,
        run_id: run_id.clone(),
        tree_sampling: stage::TreeSampling::start(),
    });
    let max_parallel = settings
        .max_parallel
        .map(|n| n as usize)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
        .max(1);

    let mut states: Vec<StageState> = Vec::with_capacity(stages.len());
    for (i, stage) in stages.iter().enumerate() {
        let state = match decisions.as_ref().map(|d| &d[i]) {
            Some(crate::store::resume::Decision::Keep {
                attempts,
                checkpoints,
                metrics,
                wall_s,
            }) => StageState {
                status: Status::Succeeded,
                attempts: *attempts,
                last: Some(LastAttempt::kept(
                    checkpoints.clone(),
                    metrics.clone(),
                    Duration::from_secs_f64(wall_s.unwrap_or(0.0).max(0.0)),
                )),
                failure: None,
            },
            Some(crate::store::resume::Decision::Run {
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
                StageState::pending(*attempts)
            }
            None => StageState::pending(0),
        };
        states.push(state);
    }
    let (cancel_tx, _) = watch::channel(CancelLevel::None);
    let mut cancel_closed = false;
    // What stages tell the run, in the order each stage tells it. A stage on the CPU gives its
    // slot back (`Freed`) as soon as its main process exited with 0 and nothing of its tree is
    // left (see `stage::supervise`), before its outputs are verified and its end recorded: the
    // next stage starts while that bookkeeping runs. Its result (`Done`) comes after, on the
    // same channel, and its downstream stages wait for that.
    let (news_tx, mut news_rx) = mpsc::unbounded_channel::<StageNews>();
    let mut freed_early: std::collections::HashSet<usize> = Default::default();
    // The stage planned to start when the one stage running ends, and stages that ended stages
    // started in their place, not yet recorded (see `handover`).
    let next_up = NextUp::default();
    let mut handed: Vec<Started> = Vec::new();
    // Attempts whose result has not come, and whether each may hand over to a successor.
    let mut live: BTreeMap<usize, bool> = BTreeMap::new();
    // Stages holding a slot (at most `max_parallel`).
    let mut running = 0usize;
    let mut interrupted = false;
    // A cancel that came before the run started applies at once.
    let early = *cancel.borrow_and_update();
    if early != CancelLevel::None {
        escalate(
            &cancel_tx,
            early,
            &mut interrupted,
            &console,
            settings.grace.get(),
        );
    }
    let mut leak_stop = false;
    let mut fail_stop = false;
    let cpus = host.cpus;
    // Per stage: why it waits for GPUs (told once per change).
    let mut waiting_why: BTreeMap<usize, String> = BTreeMap::new();
    let mut leaked_any = false;
    let started = Instant::now();
    let started_unix = crate::timefmt::unix_secs_f64();
    let report_path = run_dir.report_path();
    let timeline_csv = run_dir.root().join("gpu-timeline.csv");
    let sampler = match &services.probe {
        Some(probe) if !gpus.is_empty() => Some(
            gpu::timeline::start_sampler(
                probe.clone(),
                gpus.clone(),
                timeline_csv.clone(),
                started,
                Duration::from_millis(50),
            )
            .context("cannot write gpu-timeline.csv")?,
        ),
        _ => None,
    };
    let mut spans: Vec<gpu::timeline::StageSpan> = Vec::new();
    // A report exists from the start, so `orchestrate report` has something to show even if
    // this process is killed before the first stage ends: with `plan.resolved.json`, written
    // while the first stages run (a resumed run's, with the stages it keeps, here).
    let mut run_files = crate::run::files::RunFiles::start(
        plan.clone(),
        run_dir.clone(),
        gpu_check.clone(),
        started,
        !resume,
    )
    .context("cannot start the thread writing the run's files")?;
    if resume {
        Snapshot::new(
            &plan,
            &states,
            &run_dir,
            &gpu_check,
            started,
            RunStatus::Running,
        )
        .write_or_warn(&report_path, &console);
    }
    let mut last_report = Instant::now();
    let mut report_every = Duration::from_secs(1);

    // Readiness is tracked incrementally, so each event costs O(its neighbours), not O(stages):
    // a 10,000-stage sweep schedules in linear time.
    let position: Vec<usize> = {
        let mut pos = vec![0; stages.len()];
        for (p, &i) in plan.order.iter().enumerate() {
            pos[i] = p;
        }
        pos
    };
    let mut waiting_on: Vec<usize> = plan
        .upstream
        .iter()
        .map(|ups| {
            ups.iter()
                .filter(|&&u| states[u].status != Status::Succeeded)
                .count()
        })
        .collect();
    let mut ready: std::collections::BTreeSet<(usize, usize)> = (0..stages.len())
        .filter(|&i| waiting_on[i] == 0 && states[i].status == Status::Pending)
        .map(|i| (position[i], i))
        .collect();
    let mut retry_queue: Vec<(Instant, usize)> = Vec::new();
    // This run's event sockets, apart from other runs' of the same host (removed when the run
    // ends: declared before the preparer, which removes the sockets it holds first).
    let run_sockets = host
        .sockets
        .for_run(ticket.1)
        .context("cannot create the directory of the run's event sockets")?;
    let sockets = run_sockets.path();
    // First attempts' files are written ahead by the preparer thread: the next ready stages,
    // and the stages that wait only on a stage that just started.
    let preparer =
        crate::attempt::preparer::Preparer::start(stages.len(), tokio::runtime::Handle::current())
            .context("cannot start the stage-files thread")?;
    let on_cpu = |j: usize| stages[j].gpus_wanted() == 0 || !machine_has_gpus;
    // Whether stage `j` is one whose first attempt's files the preparer should write.
    let wants_files = |j: usize, states: &[StageState]| {
        states[j].attempts == 0 && on_cpu(j) && preparer.untouched(j)
    };
    // `open`: the stage is about to start (one of the next ready ones): its logs are opened
    // and its socket bound too, not only written.
    let prepare_ahead = |j: usize, states: &[StageState], open: bool| {
        if wants_files(j, states) {
            let inputs = crate::attempt::prepare::Layout::inputs_of(&plan, j, &run_dir);
            let layout = crate::attempt::prepare::Layout::new(
                &plan,
                j,
                &run_dir,
                1,
                protocol::worker::Device::Cpu,
                inputs,
            );
            let socket = open.then(|| crate::attempt::prepare::socket_path(sockets, j, 1));
            preparer.queue(j, layout, socket);
        }
    };

    loop {
        let stopping = interrupted || leak_stop || fail_stop;
        let now = Instant::now();
        retry_queue.retain(|&(t, i)| {
            if t <= now {
                ready.insert((position[i], i));
                false
            } else {
                true
            }
        });
        let next_retry = retry_queue.iter().map(|&(t, _)| t).min();
        let mut gpu_waiting = false;
        if !stopping || !handed.is_empty() {
            // Ready stages in order, taken one at a time: a loop turn costs what it starts
            // (and the stages it must pass over, waiting for GPUs), not the whole ready set.
            let mut cursor: Option<(usize, usize)> = None;
            loop {
                // Stages an ending stage started in its place come first: they hold the slot
                // it gave them, and are recorded even if the run is stopping now (a stop
                // asked for after they started reaches them as it reached the others).
                let (i, given, started) = if let Some((i, started)) = handed.pop() {
                    ready.remove(&(position[i], i));
                    states[i].attempts += 1;
                    states[i].status = Status::Running;
                    running += 1;
                    (i, Vec::new(), started)
                } else {
                    if stopping || running >= max_parallel {
                        break;
                    }
                    let next = match cursor {
                        None => ready.iter().next(),
                        Some(c) => ready
                            .range((std::ops::Bound::Excluded(c), std::ops::Bound::Unbounded))
                            .next(),
                    };
                    let Some(&(pos, i)) = next else {
                        break;
                    };
                    cursor = Some((pos, i));
                    let stage = &stages[i];
                    let want = if machine_has_gpus {
                        stage.gpus_wanted() as usize
                    } else {
                        0
                    };
                    if want > host.usable_gpus() {
                        ready.remove(&(position[i], i));
                        let msg = format!(
                        "needs {want} GPU(s) but only {} are usable ({} quarantined after leaks)",
                        host.usable_gpus(),
                        gpus.len() - host.usable_gpus()
                    );
                        fail_before_start(
                            i,
                            FailureClass::NoGpu,
                            msg,
                            &plan,
                            &fingerprints,
                            &mut states,
                            &mut journal,
                            &console,
                        )?;
                        continue;
                    }
                    let given = if want == 0 {
                        Vec::new()
                    } else {
                        let owner = format!("run {run_id}, stage `{}`", stage.name);
                        let taken = host.take_gpus(want, ticket, &owner, services.tolerance_bytes);
                        match taken.map_err(|wait| wait.to_string()) {
                            Ok(given) => {
                                waiting_why.remove(&i);
                                given
                            }
                            Err(why) => {
                                gpu_waiting = true;
                                if waiting_why.get(&i) != Some(&why) {
                                    console.waiting(&stage.name, &why);
                                    waiting_why.insert(i, why);
                                }
                                continue; // wait for GPUs to come free
                            }
                        }
                    };
                    ready.remove(&(position[i], i));
                    states[i].attempts += 1;
                    let attempt = states[i].attempts;
                    // The preparer's files serve a first attempt on the CPU only.
                    let written = preparer
                        .claim(i)
                        .filter(|_| attempt == 1 && given.is_empty());
                    // Built-in CPU stages that run side by side share the cores instead of each
                    // starting a thread per core.
                    let cpu_threads = (stage.kind.is_some() && given.is_empty()).then(|| {
                        let ready_cpu = ready
                            .iter()
                            .filter(|&&(_, j)| {
                                stages[j].kind.is_some()
                                    && (stages[j].gpus_wanted() == 0 || !machine_has_gpus)
                            })
                            .take(max_parallel)
                            .count();
                        let sharing = (host.cpu_builtin_running.get() + ready_cpu + 1)
                            .min(max_parallel)
                            .max(1);
                        (cpus / sharing).max(1)
                    });
                    let attempt_plan = match crate::attempt::prepare::prepare_attempt(
                        &plan,
                        i,
                        attempt,
                        &run_dir,
                        &states,
                        worker.as_deref(),
                        &given,
                        machine_has_gpus,
                        sockets,
                        cpu_threads,
                        written.as_ref().map(|&(fresh, _)| fresh),
                    ) {
                        Ok(p) => crate::slurm::srun::wrap_attempt(p, stage, slurm.as_ref()),
                        Err(failure) => {
                            host.give_back_gpus(&given);
                            fail_before_start(
                                i,
                                failure.class(),
                                failure.describe(),
                                &plan,
                                &fingerprints,
                                &mut states,
                                &mut journal,
                                &console,
                            )?;
                            continue;
                        }
                    };
                    states[i].status = Status::Running;
                    running += 1;
                    if cpu_threads.is_some() {
                        host.cpu_builtin_running
                            .set(host.cpu_builtin_running.get() + 1);
                    }
                    let stage_span = tracing::info_span!(target: "orchestrate::stage", "stage", stage = %stage.name, attempt);
                    let started = stage_span.in_scope(|| {
                        stage::start_attempt(
                            attempt_plan,
                            written.and_then(|(_, files)| files),
                            &services,
                        )
                    });
                    (i, given, started)
                };
                let stage = &stages[i];
                let attempt = states[i].attempts;
                let stage_span = tracing::info_span!(target: "orchestrate::stage", "stage", stage = %stage.name, attempt);
                match started {
                    Ok(launched) => {
                        stage_span.in_scope(|| launched.announce(&console));
                        journal.append(&JournalRecord::StageStarted {
                            stage: stage.name.clone(),
                            attempt,
                            pid: launched.pid() as u32,
                            gpus: given.iter().map(|g| g.uuid.clone()).collect(),
                            plan_hash: fingerprints.get(i),
                        })?;
                        let services = services.clone();
                        let mut cancel = cancel_tx.subscribe();
                        // A stage handed over as a stop was asked for learns of it at once.
                        if *cancel.borrow() != CancelLevel::None {
                            cancel.mark_changed();
                        }
                        let news_tx = news_tx.clone();
                        let node_check = crate::slurm::node_check::NodeCheck::for_stage(
                            stage,
                            slurm.as_ref(),
                            &run_dir.stage_dir(&stage.name),
                        );
                        // A GPU or srun stage's verdicts come after its tree is gone: it
                        // neither frees its slot early nor hands over to a successor.
                        let may_hand_over = given.is_empty() && node_check.is_none();
                        live.insert(i, may_hand_over);
                        let hand_off = Rc::new(handover::HandOff {
                            after: i,
                            next_up: next_up.clone(),
                            cancel: cancel.clone(),
                            services: services.clone(),
                        });
                        // Not with fail_fast (a failure must stop what starts next).
                        let early_free = (!settings.fail_fast && may_hand_over).then(|| {
                            let news_tx = news_tx.clone();
                            let hand_off = hand_off.clone();
                            // True when the runner has a stage to start: the stage's task
                            // then waits for it to (see `stage::supervise`).
                            Box::new(move || match hand_off.slot_freed() {
                                handover::Slot::HandedOver(started) => {
                                    let _ = news_tx.send(StageNews::HandedOver(i, started));
                                    false
                                }
                                handover::Slot::NoTaker => false,
                                handover::Slot::Free => {
                                    let _ = news_tx.send(StageNews::Freed(i));
                                    true
                                }
                            }) as Box<dyn FnOnce() -> bool>
                        });
                        let chained: Rc<std::cell::Cell<Option<Started>>> = Default::default();
                        let succeeded = may_hand_over.then(|| {
                            let chained = chained.clone();
                            Box::new(move || chained.set(hand_off.start(handover::Kind::Chain)))
                                as Box<dyn FnOnce()>
                        });
                        tokio::task::spawn_local(
                            async move {
                                let result = stage::supervise(
                                    launched, &services, cancel, early_free, succeeded,
                                )
                                .await;
                                // srun stages: the GPU check of every node of the stage.
                                if let Some(check) = node_check {
                                    check.run(&result, &services.reaper).await;
                                }
                                let _ = news_tx.send(StageNews::Done(
                                    i,
                                    Box::new(result),
                                    given,
                                    chained.take(),
                                ));
                            }
                            .instrument(stage_span),
                        );
                        // Once it runs: the stages that wait only on it are prepared while it
                        // does, opened too while few are (a chain's next stage then starts
                        // without opening anything), if they will be among the next to start
                        // (not behind a long queue of ready stages: their files would wait
                        // unopened). Down a chain of single stages, the next PREPARE_BATCH
                        // are handed over at once when the first has no files yet (one wake-up
                        // of the preparer per batch).
                        let soon = |d: usize| {
                            ready.range(..(position[d], d)).take(PREPARE_BATCH).count()
                                < PREPARE_BATCH
                        };
                        for &d in &plan.downstream[i] {
                            if waiting_on[d] != 1 || !soon(d) {
                                continue;
                            }
                            let batch = wants_files(d, &states);
                            prepare_ahead(d, &states, preparer.may_open());
                            let mut at = d;
                            for _ in 1..PREPARE_BATCH {
                                if !batch {
                                    break;
                                }
                                // The one stage after `at` that waits on nothing else.
                                let next = match plan.downstream[at].as_slice() {
                                    &[n] if waiting_on[n] == 1 && soon(n) => n,
                                    _ => break,
                                };
                                prepare_ahead(next, &states, preparer.may_open());
                                at = next;
                            }
                        }
                    }
                    Err(failure) => {
                        live.insert(i, false);
                        let failed = AttemptResult::early_failure(failure);
                        let _ = news_tx.send(StageNews::Done(i, Box::new(failed), given, None));
                    }
                }
            }
        }
        // While one stage runs alone, the stage that will start when it ends is planned now
        // and started by that stage's task (see `handover`): only a command stage's first
        // attempt on the CPU, whose files the preparer has written.
        if !stopping
            && running == 1
            && live.len() == 1
            && handed.is_empty()
            && retry_queue.is_empty()
            && !gpu_waiting
            && next_up.is_empty()
        {
            if let Some((&i, true)) = live.iter().next() {
                let candidate = match ready.iter().next() {
                    // It frees its slot early (not with fail_fast) for the first ready stage.
                    Some(&(_, j)) => (max_parallel == 1 && !settings.fail_fast)
                        .then_some((j, handover::Kind::Slot)),
                    // Nothing else is ready: the first stage that waits on it alone.
                    None => plan.downstream[i]
                        .iter()
                        .copied()
                        .filter(|&d| waiting_on[d] == 1 && states[d].status == Status::Pending)
                        .min_by_key(|&d| position[d])
                        .map(|d| (d, handover::Kind::Chain)),
                };
                let eligible = |j: usize| {
                    states[j].attempts == 0
                        && stages[j].kind.is_none()
                        && on_cpu(j)
                        && (slurm.is_none() || stages[j].task_layout().is_none())
                        && preparer.written(j)
                };
                if let Some((j, kind)) = candidate.filter(|&(j, _)| eligible(j)) {
                    let written = preparer.claim(j);
                    let planned = crate::attempt::prepare::prepare_attempt(
                        &plan,
                        j,
                        1,
                        &run_dir,
                        &states,
                        worker.as_deref(),
                        &[],
                        machine_has_gpus,
                        sockets,
                        None,
                        written.as_ref().map(|&(fresh, _)| fresh),
                    );
                    let files = written.and_then(|(_, files)| files);
                    match planned {
                        Ok(p) => next_up.plan(Successor::new(i, j, kind, p, files)),
                        // Its own start (the ordinary way) reports why it cannot start.
                        Err(_) => {
                            if let Some(files) = files {
                                files.give_back();
                            }
                        }
                    }
                }
            }
        }
        // The next ready stages' files are handed to the preparer in batches, once one of the
        // next PREPARE_LOW + 1 has none: one wake-up of its thread per batch, not one per stage
        // (on a small machine each wake-up took time from the stage just started).
        if !stopping
            && ready
                .iter()
                .take(PREPARE_LOW + 1)
                .any(|&(_, j)| wants_files(j, &states))
        {
            for &(_, j) in ready.iter().take(PREPARE_BATCH) {
                prepare_ahead(j, &states, true);
            }
        }
        // Everything queued above goes to the preparer's thread in one message.
        preparer.flush();
        if !gpu_waiting {
            host.stop_waiting(ticket);
        }
        if running == 0
            && live.is_empty()
            && (stopping || (ready.is_empty() && next_retry.is_none()))
        {
            break;
        }
        let far = Instant::now() + Duration::from_secs(86_400);
        tokio::select! {
            Some(news) = news_rx.recv() => {
                let (i, result, given) = match news {
                    StageNews::Freed(i) => {
                        running -= 1;
                        freed_early.insert(i);
                        continue;
                    }
                    StageNews::HandedOver(i, started) => {
                        running -= 1;
                        freed_early.insert(i);
                        handed.push(started);
                        continue;
                    }
                    StageNews::Done(i, result, given, chained) => {
                        // A successor planned after it that it did not start is started
                        // the ordinary way, if it still should.
                        next_up.abandon(i);
                        handed.extend(chained);
                        (i, *result, given)
                    }
                };
                live.remove(&i);
                if !freed_early.remove(&i) {
                    running -= 1;
                }
                if stages[i].kind.is_some() && given.is_empty() {
                    host.cpu_builtin_running.set(host.cpu_builtin_running.get().saturating_sub(1));
                }
                host.give_back_gpus(&given);
                let name = stages[i].name.clone();
                if let Some(t) = result.timing {
                    for g in &result.gpu {
                        spans.push(gpu::timeline::StageSpan {
                            stage: name.clone(),
                            uuid: g.uuid.clone(),
                            start_s: t.spawned - started_unix,
                            end_s: t.verified - started_unix,
                            baseline_bytes: g.baseline_bytes,
                            clean: g.verdict != protocol::report::GpuVerdict::Leaked,
                        });
                    }
                }
                for g in result
                    .gpu
                    .iter()
                    .filter(|g| g.verdict == protocol::report::GpuVerdict::Leaked)
                {
                    leaked_any = true;
                    match settings.on_leak {
                        OnLeak::Quarantine => {
                            host.quarantine(&g.uuid);
                            console.warn(&format!("GPU {} quarantined: no further stage will run on it", g.uuid));
                        }
                        OnLeak::Fail => {
                            if !leak_stop {
                                console.warn("a GPU leaked and on_leak = \"fail\": no further stage starts; the run will exit with code 3");
                            }
                            leak_stop = true;
                        }
                        OnLeak::Warn => {}
                    }
                }
                let attempt = states[i].attempts;
                match &result.outcome {
                    Outcome::Succeeded => {
                        console.stage_finished(&name, StageStatus::Succeeded, "", result.wall);
                        journal.append(&finished_record(name, attempt, StageStatus::Succeeded, None, fingerprints.get(i), Some(&result)))?;
                        states[i].status = Status::Succeeded;
                        states[i].failure = None;
                        for &d in &plan.downstream[i] {
                            waiting_on[d] -= 1;
                            // (A successor this stage started is recorded at the loop's top.)
                            if waiting_on[d] == 0
                                && states[d].status == Status::Pending
                                && !handed.iter().any(|&(h, _)| h == d)
                            {
                                ready.insert((position[d], d));
                            }
                        }
                    }
                    Outcome::Failed(failure) => {
                        let msg = failure.describe();
                        let retry = failure.retryable() && attempt <= stages[i].retries && !interrupted;
                        let note = if retry { format!("{msg}; retrying in {}", crate::report::console::human_duration(retry_backoff(attempt))) } else { msg.clone() };
                        console.stage_finished(&name, StageStatus::Failed, &note, result.wall);
                        if let Some(tail) = result.stderr_tail.as_deref().filter(|t| !t.trim().is_empty() && !retry) {
                            console.detail(&format!("---- last lines of {name}'s stderr ----\n{tail}\n----\n"));
                        }
                        journal.append(&finished_record(name, attempt, StageStatus::Failed, Some(msg.clone()), fingerprints.get(i), Some(&result)))?;
                        states[i].failure = Some(Box::new((failure.class(), msg)));
                        if retry {
                            let at = Instant::now() + retry_backoff(attempt);
                            states[i].status = Status::RetryAt(at);
                            retry_queue.push((at, i));
                        } else {
                            states[i].status = Status::Failed;
                            skip_downstream(i, &plan, &mut states, &mut journal)?;
                            // Only stages waiting on it alone were opened ahead.
                            for &d in &plan.downstream[i] {
                                preparer.release(d);
                            }
                            if settings.fail_fast && !fail_stop {
                                fail_stop = true;
                                console.warn("a stage failed and fail_fast = true: no further stage starts");
                            }
                        }
                    }
                    Outcome::Cancelled => {
                        console.stage_finished(&name, StageStatus::Cancelled, "stopped by a signal", result.wall);
                        journal.append(&finished_record(name, attempt, StageStatus::Cancelled, Some("stopped by a signal".into()), fingerprints.get(i), Some(&result)))?;
                        // Its downstream stages are skipped as interrupted when the run ends
                        // (a cancel is what stops a stage here).
                        states[i].status = Status::Cancelled;
                    }
                }
                states[i].last = Some(LastAttempt::of(result));
                // Rewriting the whole report costs O(stages): at most once a second, and never
                // more than 0.2% of the time (a 100,000-stage sweep's report is tens of
                // megabytes; every rewrite is time the next stage waits, so its share is a
                // cost per stage that grows with the plan: at 0.5% it was 3% of the scheduling
                // thread's time in a 20,000-stage sweep, two runs by hand).
                if last_report.elapsed() >= report_every {
                    run_files.finish(&console)?;
                    let t = Instant::now();
                    Snapshot::new(&plan, &states, &run_dir, &gpu_check, started, RunStatus::Running)
                        .write_or_warn(&report_path, &console);
                    report_every = (t.elapsed() * 500).max(Duration::from_secs(1));
                    last_report = Instant::now();
                }
            }
            changed = cancel.changed(), if !cancel_closed => {
                if changed.is_err() {
                    cancel_closed = true; // nobody can cancel any more
                } else {
                    let level = *cancel.borrow_and_update();
                    escalate(&cancel_tx, level, &mut interrupted, &console, settings.grace.get());
                }
            }
            _ = host.gpus_freed.notified(), if gpu_waiting => {}
            // A stage's start waits in the journal for the next record; a long stage's is
            // written at the next tick of the run's sampling clock.
            _ = services.tree_sampling.next(), if journal.has_pending() => {
                journal.flush_pending().context("cannot write the journal")?;
            }
            // A GPU held by a process that is not ours frees without telling anyone.
            _ = tokio::time::sleep(Duration::from_millis(500)), if gpu_waiting => {}
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(next_retry.unwrap_or(far))), if next_retry.is_some() => {}
        }
    }

    if slurm.is_some() && !interrupted && !cancel_closed {
        // `scancel` and the time limit signal every process of the job at once: the stop can
        // arrive with the last stage's end. Wait a moment for it.
        tokio::select! {
            biased;
            changed = cancel.changed() => {
                if changed.is_ok() && *cancel.borrow() != CancelLevel::None {
                    interrupted = true;
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    let stop_signal = stop_signal.get();
    for (i, state) in states.iter_mut().enumerate() {
        if matches!(state.status, Status::Pending | Status::RetryAt(_)) {
            let (class, reason) = if interrupted {
                (
                    FailureClass::Interrupted,
                    "not started: the run was interrupted".to_string(),
                )
            } else if fail_stop {
                (
                    FailureClass::FailFast,
                    "not started: a stage failed and fail_fast = true".to_string(),
                )
            } else {
                (
                    FailureClass::GpuLeaked,
                    "not started: a GPU leaked and on_leak = \"fail\"".to_string(),
                )
            };
            journal.append(&JournalRecord::StageSkipped {
                stage: stages[i].name.clone(),
                reason: reason.clone(),
            })?;
            state.status = Status::Skipped(class, reason);
        }
    }
    let any_failed = states
        .iter()
        .any(|s| matches!(s.status, Status::Failed | Status::Skipped(..)));
    let (status, exit_code) = if interrupted {
        (RunStatus::Interrupted, exit::INTERRUPTED)
    } else if any_failed && !leak_stop {
        (RunStatus::Failed, exit::STAGE_FAILED)
    } else if leaked_any && settings.on_leak == OnLeak::Fail {
        (RunStatus::Leaked, exit::GPU_LEAK)
    } else {
        (RunStatus::Succeeded, exit::SUCCESS)
    };
    // Slurm: why the job stopped (from Slurm's job state), journaled, and the requeue asked for.
    let (status, exit_code) = match (&slurm, stop_signal) {
        (Some(job), Some((signal, at))) if interrupted => {
            let verdict = crate::slurm::stop::after_stop(
                job,
                signal,
                at,
                &services.reaper,
                &mut journal,
                &console,
                run_dir.root(),
            )
            .await;
            (verdict.status, verdict.exit_code)
        }
        _ => (status, exit_code),
    };
    journal.append(&JournalRecord::RunFinished { status, exit_code })?;
    host.stop_waiting(ticket);
    run_files.finish(&console)?;
    let report = Snapshot::new(&plan, &states, &run_dir, &gpu_check, started, status);
    // `report.json` and the results are independent files: written at once, on two threads
    // (at 100,000 stages each takes a tenth of a second or more, after the last stage).
    let results = std::thread::scope(|scope| {
        let results = crate::report::results::has_rows(&plan).then(|| {
            scope.spawn(|| {
                crate::report::results::write(&plan, &|i| report.stage(i), run_dir.root())
            })
        });
        report.write_or_warn(&report_path, &console);
        results.map(|thread| {
            thread
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the results writer panicked")))
        })
    });
    if let Some(results) = results {
        match results {
            Ok(table) => {
                console.detail(&table);
                console.note(&format!(
                    "results: {}",
                    run_dir.root().join("results.csv").display()
                ));
            }
            Err(e) => console.warn(&format!(
                "cannot write the results in {}: {e}",
                run_dir.root().display()
            )),
        }
    }
    if let Some(sampler) = sampler {
        sampler.abort();
        let samples = gpu::timeline::read_samples(&timeline_csv);
        let picture = gpu::svg::render(&gpus, &samples, &spans, started.elapsed().as_secs_f64());
        let svg_path = run_dir.root().join("gpu-memory.svg");
        match write_replace(&svg_path, picture.as_bytes()) {
            Ok(()) => console.note(&format!("GPU memory picture: {}", svg_path.display())),
            Err(e) => console.warn(&format!("cannot write {}: {e}", svg_path.display())),
        }
    }
    console.run_finished(status, exit_code);
    Ok(RunSummary {
        exit_code,
        status: report.status(),
        summary: report.summary(),
    })
}

/// The journal's record of an attempt's end: what `resume` keeps of it (outputs only when it
/// succeeded; metrics and wall time when it ran at all).
fn finished_record(
    stage: String,
    attempt: u32,
    status: StageStatus,
    error: Option<String>,
    plan_hash: String,
    result: Option<&AttemptResult>,
) -> JournalRecord {
    JournalRecord::StageFinished {
        stage,
        attempt,
        status,
        error,
        checkpoints: match (status, result) {
            (StageStatus::Succeeded, Some(r)) => r.checkpoints.clone(),
            _ => Vec::new(),
        },
        plan_hash,
        metrics: result.map(|r| r.metrics.clone()).unwrap_or_default(),
        wall_s: result.map(|r| r.wall.as_secs_f64()),
    }
}

/// Records a stage that failed before any of its processes started (no usable GPU, an input
/// that no longer verifies), and skips everything downstream of it.
#[allow(clippy::too_many_arguments)]
fn fail_before_start(
    i: usize,
    class: FailureClass,
    msg: String,
    plan: &LoadedPlan,
    fingerprints: &crate::store::fingerprint::Background,
    states: &mut [StageState],
    journal: &mut Journal,
    console: &Console,
) -> std::io::Result<()> {
    let name = &plan.plan.stages[i].name;
    console.stage_finished(name, StageStatus::Failed, &msg, Duration::ZERO);
    journal.append(&finished_record(
        name.clone(),
        states[i].attempts,
        StageStatus::Failed,
        Some(msg.clone()),
        fingerprints.get(i),
        None,
    ))?;
    states[i].status = Status::Failed;
    states[i].failure = Some(Box::new((class, msg)));
    skip_downstream(i, plan, states, journal)
}

/// Marks every stage downstream of `failed` (transitively) as skipped, journaling each once.
fn skip_downstream(
    failed: usize,
    plan: &LoadedPlan,
    states: &mut [StageState],
    journal: &mut Journal,
) -> std::io::Result<()> {
    let mut stack = vec![failed];
    while let Some(u) = stack.pop() {
        for &d in &plan.downstream[u] {
            if matches!(states[d].status, Status::Pending | Status::RetryAt(_)) {
                let reason = format!(
                    "upstream stage `{}` did not succeed",
                    plan.plan.stages[u].name
                );
                journal.append(&JournalRecord::StageSkipped {
                    stage: plan.plan.stages[d].name.clone(),
                    reason: reason.clone(),
                })?;
                states[d].status = Status::Skipped(FailureClass::UpstreamFailed, reason);
                stack.push(d);
            }
        }
    }
    Ok(())
}

/// Passes a cancel on to the running stages, saying so once per level.
fn escalate(
    stages: &watch::Sender<CancelLevel>,
    level: CancelLevel,
    interrupted: &mut bool,
    console: &Console,
    grace: Duration,
) {
    match level {
        CancelLevel::None => {}
        CancelLevel::Graceful if !*interrupted => {
            *interrupted = true;
            console.warn(&format!(
                "stopping: running stages get SIGTERM and {} to exit; signal again to kill them now",
                crate::report::console::human_duration(grace)
            ));
            let _ = stages.send(CancelLevel::Graceful);
        }
        CancelLevel::Graceful => {}
        CancelLevel::Kill => {
            *interrupted = true;
            console.warn("killing running stages now");
            let _ = stages.send(CancelLevel::Kill);
        }
    }
}
