//! `orchestrate`: the command line. Thin: parsing, logging set-up, exit codes; the work is in
//! the `orchestrator` library.

use clap::{Parser, Subcommand, ValueEnum};
use orchestrator::console::Console;
use orchestrator::exit;
use orchestrator::plan::{load_plan, LoadedPlan};
use orchestrator::rundir::RunDir;
use orchestrator::runner::{self, RunOptions};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const AFTER_HELP: &str = "\
Examples:
  orchestrate --plan configs/quickstart.toml          run a pipeline
  orchestrate --plan p.toml --run-dir runs/exp1       run it into a chosen directory
  orchestrate validate p.toml                         check a plan without running it
  orchestrate schema > plan.schema.json               JSON Schema for editors
  orchestrate status runs/exp1                        what a resume would keep or rerun, and why
  orchestrate resume runs/exp1                        continue an interrupted run
  orchestrate report runs/exp1 [--json]               the per-stage report of a run

Exit status: 0 every stage succeeded and every GPU check passed; 1 a stage failed;
2 invalid plan or arguments; 3 a GPU leaked (on_leak = \"fail\"); 4 the run could not be set up;
75 inside a Slurm job: stopped by the warning signal (USR1/USR2) or SIGTERM and requeued;
130 interrupted by SIGINT/SIGTERM.
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
    /// Continue an interrupted run from its directory (its own copy of the plan):
    /// the same as `--plan DIR/plan.toml --run-dir DIR --resume`.
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
        /// The plan to compare with (default: the run's own copy, DIR/plan.toml).
        #[arg(long, value_name = "PLAN")]
        plan: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
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

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let default = if format == LogFormat::Json {
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

fn load_or_report(path: &Path) -> Result<LoadedPlan, ExitCode> {
    load_plan(path).map_err(|e| {
        eprint!("{e}");
        if !e.to_string().ends_with('\n') {
            eprintln!();
        }
        ExitCode::from(exit::INVALID_INPUT as u8)
    })
}

fn main() -> ExitCode {
    let mut args = std::env::args();
    if args.nth(1).as_deref() == Some(orchestrator::guard::GUARD_SUBCOMMAND) {
        let pid = args.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        return ExitCode::from(orchestrator::guard::run(pid) as u8);
    }
    let argv: Vec<String> = std::env::args().collect();
    if let Some(code) = orchestrator::slurm::launch::hidden_subcommand(&argv) {
        return ExitCode::from(code as u8);
    }
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Some(Command::Validate { plan }) => match load_or_report(&plan) {
            Ok(loaded) => {
                println!(
                    "{}: ok ({} stage{}; order: {})",
                    plan.display(),
                    loaded.plan.stages.len(),
                    if loaded.plan.stages.len() == 1 {
                        ""
                    } else {
                        "s"
                    },
                    loaded
                        .order
                        .iter()
                        .map(|&i| loaded.plan.stages[i].name.as_str())
                        .collect::<Vec<_>>()
                        .join(" → ")
                );
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Some(Command::Schema) => {
            let schema = orchestrator::plan::json_schema();
            println!(
                "{}",
                serde_json::to_string_pretty(&schema).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Some(Command::GpuCheck {
            wait,
            max_used_mib,
            json,
        }) => match orchestrator::gpu::check::run(max_used_mib << 20, wait.map(|w| w.get())) {
            Ok(result) => {
                if json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&result).unwrap_or_default()
                    );
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
                eprintln!("error: {why}");
                ExitCode::from(exit::RUN_ERROR as u8)
            }
        },
        Some(Command::Resume { run_dir, quiet }) => {
            let args = RunArgs {
                plan: Some(run_dir.join("plan.toml")),
                run_dir: Some(run_dir),
                worker: cli.run.worker,
                quiet,
                resume: true,
                follow: cli.run.follow,
            };
            let plan = args.plan.clone().unwrap_or_default();
            run_plan(&plan, args, cli.log_format)
        }
        Some(Command::Report { run_dir, json }) => {
            match orchestrator::report::load_for_display(&run_dir) {
                Ok(report) => {
                    if json {
                        println!(
                            "{}",
                            serde_json::to_string_pretty(&report).unwrap_or_default()
                        );
                    } else {
                        print!("{}", orchestrator::report::summary(&report));
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(exit::RUN_ERROR as u8)
                }
            }
        }
        Some(Command::Status {
            run_dir,
            plan,
            json,
        }) => status(&run_dir, plan.as_deref(), json),
        None => match cli.run.plan.clone() {
            Some(plan) => run_plan(&plan, cli.run, cli.log_format),
            None => {
                eprintln!("error: nothing to do: give --plan PLAN, or a subcommand (see --help)");
                ExitCode::from(exit::INVALID_INPUT as u8)
            }
        },
    }
}

fn run_plan(path: &Path, args: RunArgs, format: LogFormat) -> ExitCode {
    let loaded = match load_or_report(path) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let source = std::fs::read_to_string(path).unwrap_or_default();
    let console = Console::new(format == LogFormat::Json, args.quiet);
    let name = loaded.plan.run.name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "run".into())
    });
    // Inside a Slurm job: a run directory that stays the same across requeues, resumed after one.
    let mut args = args;
    let slurm = orchestrator::slurm::Allocation::detect();
    match orchestrator::slurm::choose_run_dir(
        slurm.as_ref(),
        args.run_dir.as_deref(),
        args.resume,
        &name,
    ) {
        Some(Ok(choice)) => (args.run_dir, args.resume) = (Some(choice.dir), choice.resume),
        Some(Err(why)) => {
            eprintln!("error: {why}");
            return ExitCode::from(exit::RUN_ERROR as u8);
        }
        None => {}
    }
    let run_dir = match &args.run_dir {
        Some(dir) if args.resume => RunDir::open_existing(dir),
        Some(dir) => RunDir::create(dir),
        None => RunDir::create_fresh(Path::new("runs"), &name),
    };
    let run_dir = match run_dir {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: cannot create the run directory: {e}");
            return ExitCode::from(exit::RUN_ERROR as u8);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(exit::RUN_ERROR as u8);
        }
    };
    let local = tokio::task::LocalSet::new();
    let options = RunOptions {
        plan: loaded,
        plan_source: source,
        run_dir,
        worker: args.worker,
        console: console.clone(),
        resume: args.resume,
        follow: args.follow,
    };
    match local.block_on(&runtime, runner::run(options)) {
        Ok(summary) => {
            console.block(&orchestrator::report::summary(&summary.report));
            ExitCode::from(summary.exit_code as u8)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit::RUN_ERROR as u8)
        }
    }
}

fn status(run_dir: &Path, plan: Option<&Path>, json: bool) -> ExitCode {
    let plan_path = plan
        .map(Path::to_path_buf)
        .unwrap_or_else(|| run_dir.join("plan.toml"));
    let loaded = match load_or_report(&plan_path) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let journal = run_dir.join("journal.jsonl");
    let records = match orchestrator::journal::read_journal(&journal) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", journal.display());
            return ExitCode::from(exit::RUN_ERROR as u8);
        }
    };
    let prints = orchestrator::fingerprint::stage_fingerprints(&loaded);
    let decisions = orchestrator::resume::decide(&loaded, &prints, &records);
    if json {
        let rows: Vec<serde_json::Value> = loaded
            .plan
            .stages
            .iter()
            .zip(&decisions)
            .map(|(s, d)| serde_json::json!({"stage": s.name, "resume": d}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
    } else {
        print!("{}", orchestrator::resume::render(&loaded, &decisions));
    }
    ExitCode::SUCCESS
}
