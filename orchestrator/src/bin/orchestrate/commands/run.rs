//! Running a plan: `orchestrate --plan P`, `--resume`, `orchestrate resume DIR`.

use super::{nothing_to_do, plan_error, run_dir_error};
use crate::cli::{LogFormat, RunArgs};
use orchestrator::attempt::launch::CancelLevel;
use orchestrator::events::Events;
use orchestrator::exit;
use orchestrator::plan::{LoadedPlan, PlanFormat};
use orchestrator::report::console::Console;
use orchestrator::run::{self, RunOptions};
use orchestrator::settings::Settings;
use orchestrator::store::rundir::RunDir;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// A plan ready to run.
pub(crate) struct PlanToRun {
    /// Its file.
    pub(crate) path: PathBuf,
    /// Its format.
    pub(crate) format: PlanFormat,
    /// The plan.
    pub(crate) loaded: LoadedPlan,
    /// The text the run directory keeps.
    pub(crate) source: String,
}

/// Runs a plan: `--plan P [--run-dir D]`, `--plan P --run-dir D --resume` (an edited plan),
/// or `resume D` (no plan: the run's own copy, with its recorded base directory).
pub(crate) fn run_plan(mut args: RunArgs, format: LogFormat) -> ExitCode {
    // The process's `ORCHESTRATE_*` switches, read once.
    let settings = Settings::from_env();
    // A plan given on the command line is read once, first.
    let given: Option<PlanToRun> = match &args.plan {
        Some(path) => match orchestrator::plan::read_plan(path) {
            Ok((loaded, source)) => Some(PlanToRun {
                path: path.clone(),
                format: orchestrator::plan::format_of(path),
                loaded,
                source,
            }),
            Err(e) => return plan_error(e),
        },
        None => None,
    };
    if let Some(PlanToRun { path, loaded, .. }) = &given {
        if let Some(refusal) = orchestrator::run::preflight::host_limits_refusal(loaded, &settings)
        {
            eprintln!("error: {}: {refusal}", path.display());
            return ExitCode::from(exit::INVALID_INPUT as u8);
        }
        if let Err(code) = choose_slurm_run_dir(&mut args, &run_name(loaded, path)) {
            return code;
        }
    }
    // A resumed run's directory is taken (locked) before it is touched: a live owner is
    // refused before anything else happens.
    let resumed_dir = match (&args.run_dir, args.resume) {
        (Some(dir), true) => match RunDir::open_existing(dir) {
            Ok(d) => Some(d),
            Err(e) => return run_dir_error(&e),
        },
        _ => None,
    };
    let PlanToRun {
        path,
        format: plan_format,
        loaded,
        source,
    } = match (given, &resumed_dir) {
        (Some(given), _) => given,
        (None, Some(dir)) => match load_run_plan(dir.root()) {
            Ok(found) => found,
            Err(code) => return code,
        },
        (None, None) => return nothing_to_do(),
    };
    let events = Events::new().with(Console::new(format == LogFormat::Json, args.quiet));
    let run_dir = match (resumed_dir, &args.run_dir) {
        (Some(d), _) => Ok(d),
        (None, Some(dir)) => RunDir::create(dir),
        (None, None) => RunDir::create_fresh(Path::new("runs"), &run_name(&loaded, &path)),
    };
    let run_dir = match run_dir {
        Ok(d) => d,
        Err(e) => return run_dir_error(&e),
    };
    let options = RunOptions {
        plan: loaded,
        plan_source: source,
        plan_format,
        run_dir,
        worker: args.worker,
        events: events.clone(),
        resume: args.resume,
        follow: args.follow,
        stop_signal: Default::default(),
    };
    run_to_end(options, settings, &events)
}

/// Inside a Slurm job: a run directory that stays the same across requeues of the job,
/// resumed after one. `Err` is the exit status after saying why there is none.
fn choose_slurm_run_dir(args: &mut RunArgs, name: &str) -> Result<(), ExitCode> {
    let Some(job) = orchestrator::slurm::Allocation::detect() else {
        return Ok(());
    };
    match orchestrator::slurm::choose_run_dir(
        Some(&job),
        args.run_dir.as_deref(),
        args.resume,
        name,
    ) {
        Some(Ok(choice)) => (args.run_dir, args.resume) = (Some(choice.dir), choice.resume),
        Some(Err(why)) => {
            eprintln!("error: {why}");
            return Err(ExitCode::from(exit::RUN_ERROR as u8));
        }
        None => {}
    }
    Ok(())
}

/// Runs the run to its end on this process's own host; prints its summary and gives its exit
/// status.
fn run_to_end(options: RunOptions, settings: Settings, events: &Events) -> ExitCode {
    let runtime = match super::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let local = tokio::task::LocalSet::new();
    // The run is a task of the set, like its stages' tasks: a stage's news wakes it within
    // the set's turn, not through a turn of the runtime (which first looks for I/O events).
    let run = async {
        match tokio::task::spawn_local(run_on_own_host(options, settings)).await {
            Ok(result) => result,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    };
    match local.block_on(&runtime, run) {
        Ok(summary) => {
            events.summary(&summary.summary);
            ExitCode::from(summary.exit_code as u8)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit::RUN_ERROR as u8)
        }
    }
}

/// The CLI's shape: one host, one run, and the terminal's signals mapped to cancellation:
/// SIGINT, SIGTERM or SIGHUP stop the run gracefully, a second one kills its stages.
async fn run_on_own_host(
    options: RunOptions,
    settings: Settings,
) -> anyhow::Result<run::RunSummary> {
    use tokio::signal::unix::{signal, SignalKind};
    let in_slurm = orchestrator::slurm::Allocation::detect().is_some();
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    // A closed terminal (an SSH disconnect) is a request to stop like any other.
    let mut sighup = signal(SignalKind::hangup())?;
    // Inside Slurm, the job's warning signal (`#SBATCH --signal=B:USR2@N`) too.
    let mut warning = orchestrator::slurm::WarningSignals::listen(in_slurm)?;
    let host = orchestrator::host::Host::start(settings)?;
    let admission = run::Admission {
        run_id: (options.run_dir.root().file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        ticket: host.ticket(0),
    };
    let first_signal = options.stop_signal.clone();
    let (cancel, cancelled) = tokio::sync::watch::channel(CancelLevel::None);
    tokio::task::spawn_local(async move {
        loop {
            let name: &'static str = tokio::select! {
                _ = sigint.recv() => "SIGINT",
                _ = sigterm.recv() => "SIGTERM",
                _ = sighup.recv() => "SIGHUP",
                sig = warning.recv() => sig,
            };
            first_signal.note(name, orchestrator::timefmt::unix_secs_f64());
            let next = match *cancel.borrow() {
                CancelLevel::None => CancelLevel::Graceful,
                // In a Slurm job a repeated TERM or warning signal does not kill the stages
                // being checkpointed: Slurm's own SIGKILL after KillWait is the escalation.
                _ if in_slurm && name != "SIGINT" => CancelLevel::Graceful,
                _ => CancelLevel::Kill,
            };
            cancel.send_replace(next);
        }
    });
    Ok(run::run(options, admission, &host, cancelled).await?)
}

/// A run's name: the plan's `run.name`, else the plan file's stem.
fn run_name(loaded: &LoadedPlan, path: &Path) -> String {
    loaded.plan.run.name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "run".into())
    })
}

/// Loads the plan copy kept in the run directory `root`, based where the original plan was.
pub(crate) fn load_run_plan(root: &Path) -> Result<PlanToRun, ExitCode> {
    let (path, format, base) =
        orchestrator::store::rundir::run_plan_location(root).map_err(|e| {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code() as u8)
        })?;
    if !base.is_dir() {
        eprintln!(
            "error: the plan of the run in {} refers to paths relative to {}, which no longer exists; resume it with the plan from its new place: `orchestrate --plan PLAN --run-dir {} --resume`",
            root.display(),
            base.display(),
            root.display()
        );
        return Err(ExitCode::from(exit::INVALID_INPUT as u8));
    }
    let (loaded, source) =
        orchestrator::plan::load_plan_based(&path, format, &base).map_err(plan_error)?;
    Ok(PlanToRun {
        path,
        format,
        loaded,
        source,
    })
}
