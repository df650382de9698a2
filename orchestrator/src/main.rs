//! `orchestrate`: the command line. Thin: parsing, logging set-up, exit codes; the work is in
//! the `orchestrator` library.
// The doc comments of the command-line types are `--help` text, where `<name>` is the usual
// placeholder, not an HTML tag.
#![allow(rustdoc::invalid_html_tags)]

use clap::{Parser, Subcommand, ValueEnum};
use orchestrator::attempt::launch::CancelLevel;
use orchestrator::exit;
use orchestrator::plan::PlanFormat;
use orchestrator::plan::{load_plan, LoadedPlan};
use orchestrator::report::console::Console;
use orchestrator::run::{self, RunOptions};
use orchestrator::store::rundir::{RunDir, RunDirError};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod client_cmd;

const AFTER_HELP: &str = "\
Examples:
  orchestrate --plan configs/quickstart.toml          run a pipeline
  orchestrate --plan p.toml --run-dir runs/exp1       run it into a chosen directory
  orchestrate validate p.toml                         check a plan without running it
  orchestrate schema > plan.schema.json               JSON Schema for editors
  orchestrate status runs/exp1                        what a resume would keep or rerun, and why
  orchestrate resume runs/exp1                        continue an interrupted run
  orchestrate report runs/exp1 [--json]               the per-stage report of a run
  orchestrate daemon &                                serve plans over a Unix socket
  orchestrate submit p.toml --watch                   run a plan in the daemon, follow it
  orchestrate runs | watch ID | cancel ID | shutdown  the daemon's runs

Exit status: 0 every stage succeeded and every GPU check passed; 1 a stage failed;
2 invalid plan or arguments (or a --run-dir that is not empty and not a run directory);
3 a GPU leaked (on_leak = \"fail\"); 4 the run could not be set up or carried on (the run
directory is in use by another live orchestrate, a journal write failed, ...);
75 inside a Slurm job: stopped by the warning signal (USR1/USR2) or SIGTERM and requeued;
130 interrupted by SIGINT, SIGTERM or SIGHUP (a closed terminal: use nohup or setsid for runs
that must outlive the session).
Logs: RUST_LOG (e.g. RUST_LOG=debug) sets the log level; --log-format json for log collectors.";

/// Runs training pipelines stage by stage, every stage in a fresh process, and verifies that
/// each stage gave its GPU memory back before the next one uses the GPU.
#[derive(Parser, Debug)]
#[command(name = "orchestrate", version, after_help = AFTER_HELP, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
    /// Log format on stderr: human text, or one JSON object per line.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The plan to run (TOML, or JSON by extension).
    #[arg(long, value_name = "PLAN")]
    plan: Option<PathBuf>,
    /// Run directory (default: runs/<name>-<UTC time> under the current directory; inside a
    /// Slurm job runs/<name>-slurm-<job id>, resumed when the job is requeued).
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Path of the stage-worker binary (default: beside orchestrate).
    #[arg(long, value_name = "PATH")]
    worker: Option<PathBuf>,
    /// Print only the final summary.
    #[arg(long, short)]
    quiet: bool,
    /// Continue the run in --run-dir: stages that finished and whose outputs still verify are
    /// kept; interrupted, failed, edited stages and everything downstream of them run again.
    #[arg(long, requires = "run_dir")]
    resume: bool,
    /// Also show every stage's stdout and stderr on the console, line by line, prefixed with
    /// the stage's name (they always go to the stage's log files).
    #[arg(long, short)]
    follow: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check a plan without running anything: exit 0, or 2 with every problem found.
    Validate {
        /// The plan file.
        plan: PathBuf,
    },
    /// Print the plan format's JSON Schema (for editor completion and validation).
    Schema,
    /// Continue an interrupted run from its directory, with its own copy of the plan
    /// (plan.toml or plan.json); relative paths in it mean what they meant where the plan was.
    /// To resume with an edited plan: `--plan P --run-dir DIR --resume`.
    Resume {
        /// The run directory.
        run_dir: PathBuf,
        /// Print only the final summary.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Show a run's report: a table per stage (or the JSON with --json). A run that did not
    /// finish (crash, kill -9) is shown as interrupted, with each stage's state from the journal.
    Report {
        /// The run directory.
        run_dir: PathBuf,
        /// Print report.json.
        #[arg(long)]
        json: bool,
    },
    /// Show what a resume of a run directory would keep and run again, and why, without
    /// running anything.
    Status {
        /// The run directory.
        run_dir: PathBuf,
        /// The plan to compare with (default: the run's own copy in DIR).
        #[arg(long, value_name = "PLAN")]
        plan: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Serve plans submitted over a Unix socket: many runs at once on this machine's GPUs, one
    /// stage per GPU at a time, each stage in a fresh process (see docs/protocol.md).
    Daemon {
        /// The socket (default: $XDG_RUNTIME_DIR/orchestrate/daemon.sock, or
        /// /tmp/orchestrate-<uid>/daemon.sock).
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
        /// Where run directories go, and are recovered from on start (default:
        /// $XDG_STATE_HOME/orchestrate/runs, or ~/.local/state/orchestrate/runs).
        #[arg(long, value_name = "DIR")]
        runs_dir: Option<PathBuf>,
        /// Close a connection that sends no complete request for this long.
        #[arg(long, value_name = "DURATION", default_value = "60s")]
        idle_timeout: protocol::duration::HumanDuration,
    },
    /// Submit a plan to the daemon; prints the run's id (exit 0 only if the run succeeded,
    /// with --watch or --wait).
    Submit {
        /// The plan file (TOML, or JSON by extension).
        plan: PathBuf,
        #[command(flatten)]
        daemon: SocketArg,
        /// Stream the run's events until it ends.
        #[arg(long, conflicts_with = "wait")]
        watch: bool,
        /// Wait for the run to end.
        #[arg(long)]
        wait: bool,
        /// Print the daemon's answers as JSON lines.
        #[arg(long)]
        json: bool,
        /// A client-chosen id: submitting again with the same id returns the same run.
        #[arg(long, value_name = "ID")]
        id: Option<String>,
        /// Higher runs get GPUs first (default 0).
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
    },
    /// List the daemon's runs.
    Runs {
        #[command(flatten)]
        daemon: SocketArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stream a run's events (from its start, or from --from) until it ends.
    Watch {
        /// The run's id.
        id: String,
        #[command(flatten)]
        daemon: SocketArg,
        /// First event to show (its sequence number).
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Wait for a run to end; exit with its exit status.
    Wait {
        /// The run's id.
        id: String,
        #[command(flatten)]
        daemon: SocketArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop a run: its stages get SIGTERM and their grace (--kill: SIGKILL now).
    Cancel {
        /// The run's id.
        id: String,
        #[command(flatten)]
        daemon: SocketArg,
        /// Kill its stages at once.
        #[arg(long)]
        kill: bool,
    },
    /// Stop the daemon once its runs have finished (--cancel: stop them gracefully first;
    /// they resume when the daemon starts again).
    Shutdown {
        #[command(flatten)]
        daemon: SocketArg,
        /// Stop running runs gracefully instead of waiting for them.
        #[arg(long)]
        cancel: bool,
    },
    /// Inventory and memory of this machine's GPUs (NVML); with --wait, wait until each is
    /// clean (no compute process, used memory under the threshold). Exit 0 clean, 3 not
    /// clean, 4 NVML unavailable. For Slurm prolog/epilog scripts.
    GpuCheck {
        /// Wait up to this long for the GPUs to become clean ("30s", "2m").
        #[arg(long, value_name = "DURATION")]
        wait: Option<protocol::duration::HumanDuration>,
        /// Used memory (MiB) at or under which a GPU without processes counts as clean.
        #[arg(long, default_value_t = 1024)]
        max_used_mib: u64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Where the daemon listens.
#[derive(clap::Args, Debug)]
struct SocketArg {
    /// The daemon's socket (default: the per-user path `orchestrate daemon` uses).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

impl SocketArg {
    fn path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(orchestrator::daemon::socket::default_path)
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_logging(format: LogFormat, daemon: bool) {
    use tracing_subscriber::EnvFilter;
    let default = if daemon {
        // The daemon's own log: what it serves and refuses.
        "orchestrator=info,orchestrate=info,warn"
    } else if format == LogFormat::Json {
        "orchestrate=info,warn"
    } else {
        "warn"
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_target(false).init(),
    }
}

/// The single-threaded async runtime a run or the daemon runs on; the exit status to end with
/// (after saying why) when it cannot start.
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("error: cannot start the runtime: {e}");
            ExitCode::from(exit::RUN_ERROR as u8)
        })
}

/// Prints `value` as indented JSON on stdout: what every `--json` output and `schema` print.
fn print_json(value: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

fn plan_error(e: orchestrator::plan::PlanError) -> ExitCode {
    // Rendered first and written at once: stderr is unbuffered, and a plan with 100,000
    // problems would otherwise take a write per piece of each.
    let mut text = e.to_string();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    eprint!("{text}");
    ExitCode::from(exit::INVALID_INPUT as u8)
}

fn load_or_report(path: &Path) -> Result<LoadedPlan, ExitCode> {
    load_plan(path).map_err(plan_error)
}

/// The order stages would start in, for `validate`: every stage of a small plan; the first
/// and last few of a sweep, with a count of those between.
fn order_text(loaded: &orchestrator::plan::LoadedPlan) -> String {
    const ENDS: usize = 5;
    let name = |i: &usize| loaded.plan.stages[*i].name.as_str();
    let order = &loaded.order;
    if order.len() <= 4 * ENDS {
        return order.iter().map(name).collect::<Vec<_>>().join(" → ");
    }
    let head: Vec<&str> = order[..ENDS].iter().map(name).collect();
    let tail: Vec<&str> = order[order.len() - ENDS..].iter().map(name).collect();
    format!(
        "{} → … {} more … → {}",
        head.join(" → "),
        order.len() - 2 * ENDS,
        tail.join(" → ")
    )
}

fn main() -> ExitCode {
    // Before any thread exists, so that every thread blocks it (see `reaper`).
    orchestrator::process::reaper::block_child_signals();
    let mut args = std::env::args();
    if args.nth(1).as_deref() == Some(orchestrator::process::guard::GUARD_SUBCOMMAND) {
        let pid = args.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let cleanup = args.next().map(PathBuf::from);
        return ExitCode::from(orchestrator::process::guard::run(pid, cleanup) as u8);
    }
    let argv: Vec<String> = std::env::args().collect();
    if let Some(code) = orchestrator::slurm::launch::hidden_subcommand(&argv) {
        return ExitCode::from(code as u8);
    }
    let cli = Cli::parse();
    init_logging(
        cli.log_format,
        matches!(cli.command, Some(Command::Daemon { .. })),
    );
    match cli.command {
        Some(Command::Validate { plan }) => match load_or_report(&plan) {
            Ok(loaded) => {
                let problems = orchestrator::plan::launch_size_problems(&loaded);
                for problem in &problems {
                    let kind = if problem.fatal { "error" } else { "warning" };
                    eprintln!("{}: {kind}: {}", plan.display(), problem.text);
                }
                if problems.iter().any(|p| p.fatal) {
                    return ExitCode::from(exit::INVALID_INPUT as u8);
                }
                println!(
                    "{}: ok ({} stage{}; order: {})",
                    plan.display(),
                    loaded.plan.stages.len(),
                    if loaded.plan.stages.len() == 1 {
                        ""
                    } else {
                        "s"
                    },
                    order_text(&loaded)
                );
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Some(Command::Schema) => {
            let schema = orchestrator::plan::json_schema();
            print_json(&schema);
            ExitCode::SUCCESS
        }
        Some(Command::GpuCheck {
            wait,
            max_used_mib,
            json,
        }) => match orchestrator::gpu::check::run(max_used_mib << 20, wait.map(|w| w.get())) {
            Ok(result) => {
                if json {
                    print_json(&result);
                } else {
                    print!("{}", orchestrator::gpu::check::render_text(&result));
                }
                if result.clean {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(exit::GPU_LEAK as u8)
                }
            }
            Err(why) => {
                if json {
                    // Machine-readable output stays machine-readable when NVML is missing.
                    let out = serde_json::json!({
                        "v": protocol::PROTOCOL_VERSION,
                        "available": false,
                        "error": why.to_string(),
                        "clean": false,
                        "gpus": [],
                    });
                    print_json(&out);
                } else {
                    eprintln!("error: {why}");
                }
                ExitCode::from(exit::RUN_ERROR as u8)
            }
        },
        Some(Command::Resume { run_dir, quiet }) => {
            let args = RunArgs {
                plan: None,
                run_dir: Some(run_dir),
                worker: cli.run.worker,
                quiet,
                resume: true,
                follow: cli.run.follow,
            };
            run_plan(args, cli.log_format)
        }
        Some(Command::Report { run_dir, json }) => {
            match orchestrator::report::load_for_display(&run_dir) {
                Ok(report) => {
                    if json {
                        print_json(&report);
                    } else {
                        print!("{}", orchestrator::report::summary(&report));
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(e.exit_code() as u8)
                }
            }
        }
        Some(Command::Status {
            run_dir,
            plan,
            json,
        }) => status(&run_dir, plan.as_deref(), json),
        Some(Command::Daemon {
            socket,
            runs_dir,
            idle_timeout,
        }) => {
            let config = orchestrator::daemon::DaemonConfig {
                socket: socket.unwrap_or_else(orchestrator::daemon::socket::default_path),
                runs_dir: runs_dir.unwrap_or_else(orchestrator::daemon::default_runs_dir),
                idle_timeout: idle_timeout.get(),
                worker: cli.run.worker,
            };
            let runtime = match runtime() {
                Ok(rt) => rt,
                Err(code) => return code,
            };
            let local = tokio::task::LocalSet::new();
            match local.block_on(&runtime, orchestrator::daemon::serve(config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(exit::RUN_ERROR as u8)
                }
            }
        }
        Some(Command::Submit {
            plan,
            daemon,
            watch,
            wait,
            json,
            id,
            priority,
        }) => client_cmd::submit(&daemon.path(), &plan, watch, wait, json, id, priority),
        Some(Command::Runs { daemon, json }) => client_cmd::runs(&daemon.path(), json),
        Some(Command::Watch {
            id,
            daemon,
            from,
            json,
        }) => client_cmd::watch(&daemon.path(), &id, from, json),
        Some(Command::Wait { id, daemon, json }) => client_cmd::wait(&daemon.path(), &id, json),
        Some(Command::Cancel { id, daemon, kill }) => client_cmd::cancel(&daemon.path(), &id, kill),
        Some(Command::Shutdown { daemon, cancel }) => client_cmd::shutdown(&daemon.path(), cancel),
        None => match cli.run.plan.clone() {
            Some(_) => run_plan(cli.run, cli.log_format),
            None => {
                eprintln!("error: nothing to do: give --plan PLAN, or a subcommand (see --help)");
                ExitCode::from(exit::INVALID_INPUT as u8)
            }
        },
    }
}

/// The CLI's shape: one host, one run, and the terminal's signals mapped to cancellation:
/// SIGINT, SIGTERM or SIGHUP stop the run gracefully, a second one kills its stages.
async fn run_on_own_host(mut options: RunOptions) -> anyhow::Result<run::RunSummary> {
    use tokio::signal::unix::{signal, SignalKind};
    let in_slurm = orchestrator::slurm::Allocation::detect().is_some();
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    // A closed terminal (an SSH disconnect) is a request to stop like any other.
    let mut sighup = signal(SignalKind::hangup())?;
    // Inside Slurm, the job's warning signal (`#SBATCH --signal=B:USR2@N`) too.
    let mut warning = orchestrator::slurm::WarningSignals::listen(in_slurm)?;
    let host = orchestrator::host::Host::start()?;
    options.run_id = options
        .run_dir
        .root()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    options.ticket = host.ticket(0);
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
            if first_signal.get().is_none() {
                first_signal.set(Some((name, orchestrator::timefmt::unix_secs_f64())));
            }
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
    Ok(run::run(options, &host, cancelled).await?)
}

/// A run's name: the plan's `run.name`, else the plan file's stem.
fn run_name(loaded: &LoadedPlan, path: &Path) -> String {
    loaded.plan.run.name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "run".into())
    })
}

fn run_dir_error(e: &RunDirError) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(e.exit_code() as u8)
}

/// Runs a plan: `--plan P [--run-dir D]`, `--plan P --run-dir D --resume` (an edited plan),
/// or `resume D` (no plan: the run's own copy, with its recorded base directory).
fn run_plan(mut args: RunArgs, format: LogFormat) -> ExitCode {
    // A plan given on the command line is read once, first.
    let given: Option<PlanToRun> = match &args.plan {
        Some(path) => match orchestrator::plan::read_plan(path) {
            Ok((l, source)) => Some((path.clone(), orchestrator::plan::format_of(path), l, source)),
            Err(e) => return plan_error(e),
        },
        None => None,
    };
    // Inside a Slurm job: a run directory that stays the same across requeues of the job,
    // resumed after one.
    if let (Some((path, _, loaded, _)), Some(job)) =
        (&given, orchestrator::slurm::Allocation::detect())
    {
        match orchestrator::slurm::choose_run_dir(
            Some(&job),
            args.run_dir.as_deref(),
            args.resume,
            &run_name(loaded, path),
        ) {
            Some(Ok(choice)) => (args.run_dir, args.resume) = (Some(choice.dir), choice.resume),
            Some(Err(why)) => {
                eprintln!("error: {why}");
                return ExitCode::from(exit::RUN_ERROR as u8);
            }
            None => {}
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
    let (path, plan_format, loaded, source) = match (given, &resumed_dir) {
        (Some(given), _) => given,
        (None, Some(dir)) => match load_run_plan(dir.root()) {
            Ok(found) => found,
            Err(code) => return code,
        },
        (None, None) => {
            eprintln!("error: nothing to do: give --plan PLAN, or a subcommand (see --help)");
            return ExitCode::from(exit::INVALID_INPUT as u8);
        }
    };
    let console = Console::new(format == LogFormat::Json, args.quiet);
    let run_dir = match (resumed_dir, &args.run_dir) {
        (Some(d), _) => Ok(d),
        (None, Some(dir)) => RunDir::create(dir),
        (None, None) => RunDir::create_fresh(Path::new("runs"), &run_name(&loaded, &path)),
    };
    let run_dir = match run_dir {
        Ok(d) => d,
        Err(e) => return run_dir_error(&e),
    };
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let local = tokio::task::LocalSet::new();
    let options = RunOptions {
        plan: loaded,
        plan_source: source,
        plan_format,
        run_dir,
        worker: args.worker,
        console: console.clone(),
        resume: args.resume,
        follow: args.follow,
        run_id: String::new(),
        ticket: (0, 0),
        stop_signal: Default::default(),
    };
    // The run is a task of the set, like its stages' tasks: a stage's news wakes it within
    // the set's turn, not through a turn of the runtime (which first looks for I/O events).
    let run = async {
        match tokio::task::spawn_local(run_on_own_host(options)).await {
            Ok(result) => result,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    };
    match local.block_on(&runtime, run) {
        Ok(summary) => {
            console.block(&summary.summary);
            ExitCode::from(summary.exit_code as u8)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit::RUN_ERROR as u8)
        }
    }
}

/// A plan ready to run: its file, format, the plan, and the text the run directory keeps.
type PlanToRun = (PathBuf, PlanFormat, LoadedPlan, String);

/// Loads the plan copy kept in the run directory `root`, based where the original plan was.
fn load_run_plan(root: &Path) -> Result<PlanToRun, ExitCode> {
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
    Ok((path, format, loaded, source))
}

fn status(run_dir: &Path, plan: Option<&Path>, json: bool) -> ExitCode {
    let root = match orchestrator::store::rundir::existing_run(run_dir) {
        Ok(r) => r,
        Err(e) => return run_dir_error(&e),
    };
    let loaded = match plan {
        Some(p) => match load_or_report(p) {
            Ok(l) => l,
            Err(code) => return code,
        },
        None => match load_run_plan(&root) {
            Ok((_, _, l, _)) => l,
            Err(code) => return code,
        },
    };
    let records = match orchestrator::store::journal::read_run_journal(&root) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot read the journal: {e}");
            return ExitCode::from(exit::RUN_ERROR as u8);
        }
    };
    let owner = orchestrator::store::rundir::live_owner(&root);
    // While the run is live, a stage started and not finished is running, not interrupted.
    let running = match owner {
        Some(_) => orchestrator::store::journal::open_attempts(
            &root.join(orchestrator::store::rundir::JOURNAL_FILE),
        )
        .unwrap_or_default(),
        None => Vec::new(),
    };
    let running_of = |stage: &str| running.iter().find(|a| a.stage == stage);
    let prints = orchestrator::store::fingerprint::stage_fingerprints(&loaded);
    let decisions = orchestrator::store::resume::decide(&loaded, &prints, &records);
    if json {
        let rows: Vec<serde_json::Value> = loaded
            .plan
            .stages
            .iter()
            .zip(&decisions)
            .map(|(s, d)| match running_of(&s.name) {
                Some(a) => serde_json::json!({"stage": s.name, "resume": d, "running": {
                    "attempt": a.attempt, "pid": a.pid, "since_unix_ms": a.since_ms}}),
                None => serde_json::json!({"stage": s.name, "resume": d}),
            })
            .collect();
        let out = serde_json::json!({
            "run_dir": root.display().to_string(),
            "live": owner.as_ref().map(|o| serde_json::json!({"pid": o.pid, "host": o.host})),
            "stages": rows,
        });
        print_json(&out);
    } else {
        if let Some(owner) = &owner {
            println!(
                "{} is running now ({owner}); stages not running now show what a resume would do:",
                root.display()
            );
        }
        let now_ms = orchestrator::timefmt::unix_ms();
        let text = orchestrator::store::resume::render(&loaded, &decisions);
        let names = loaded.plan.stages.iter().map(|s| s.name.as_str());
        let width = orchestrator::report::table::column_width("stage", names);
        for (line, stage) in text.lines().zip(&loaded.plan.stages) {
            match running_of(&stage.name) {
                Some(a) => {
                    println!(
                        "{:<width$}  running (attempt {}, pid {}, since {}, {:.0} s ago)",
                        stage.name,
                        a.attempt,
                        a.pid,
                        orchestrator::timefmt::rfc3339_ms(a.since_ms),
                        now_ms.saturating_sub(a.since_ms) as f64 / 1e3
                    );
                }
                None => println!("{line}"),
            }
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    #[test]
    fn help_lists_every_exit_status_with_its_meaning() {
        let text = super::AFTER_HELP
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        for (code, meaning) in orchestrator::exit::ALL {
            let entry = format!("{code} {meaning}");
            assert!(text.contains(&entry), "--help lacks {entry:?}: {text}");
        }
    }
}
