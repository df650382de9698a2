//! The command line's shape: every option and subcommand, whose doc comments are the `--help`
//! text.

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

pub(crate) const AFTER_HELP: &str = "\
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
  orchestrate gpu release 0                           give a quarantined GPU back to the daemon

Exit status: 0 every stage succeeded and every GPU check passed; 1 a stage failed;
2 invalid plan or arguments (or a --run-dir that is not empty and not a run directory);
3 a GPU leaked (the run ends \"leaked\" under on_leak = \"fail\", else \"succeeded with leaked
GPU memory\"); 4 the run could not be set up or carried on (the run
directory is in use by another live orchestrate, a journal write failed, ...);
75 inside a Slurm job: stopped by the warning signal (USR1/USR2) or SIGTERM and requeued;
130 interrupted by SIGINT, SIGTERM or SIGHUP (a closed terminal: use nohup or setsid for runs
that must outlive the session).
Logs: RUST_LOG (e.g. RUST_LOG=debug) sets the log level; --log-format json for log collectors.";

/// Runs training pipelines stage by stage, every stage in a fresh process, and verifies that
/// each stage gave its GPU memory back before the next one uses the GPU.
#[derive(Parser, Debug)]
#[command(name = "orchestrate", version, after_help = AFTER_HELP, args_conflicts_with_subcommands = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    #[command(flatten)]
    pub(crate) run: RunArgs,
    /// Log format on stderr: human text, or one JSON object per line.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub(crate) log_format: LogFormat,
}

#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// The plan to run (TOML, or JSON by extension).
    #[arg(long, value_name = "PLAN")]
    pub(crate) plan: Option<PathBuf>,
    /// Run directory (default: runs/<name>-<UTC time> under the current directory; inside a
    /// Slurm job runs/<name>-slurm-<job id>, resumed when the job is requeued).
    #[arg(long, value_name = "DIR")]
    pub(crate) run_dir: Option<PathBuf>,
    /// Path of the stage-worker binary (default: beside orchestrate).
    #[arg(long, value_name = "PATH")]
    pub(crate) worker: Option<PathBuf>,
    /// Print only the final summary.
    #[arg(long, short)]
    pub(crate) quiet: bool,
    /// Continue the run in --run-dir: stages that finished and whose outputs still verify are
    /// kept; interrupted, failed, edited stages and everything downstream of them run again.
    #[arg(long, requires = "run_dir")]
    pub(crate) resume: bool,
    /// Also show every stage's stdout and stderr on the console, line by line, prefixed with
    /// the stage's name (they always go to the stage's log files).
    #[arg(long, short)]
    pub(crate) follow: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
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
        /// Serve a web view of the runs and `/metrics` on ADDR (default 127.0.0.1:8765); its
        /// token URL is printed, and the token written to `<socket>.web-token`.
        #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = orchestrator::web::DEFAULT_ADDR)]
        http: Option<std::net::SocketAddr>,
        /// Allow a non-loopback --http address (anyone who reaches it with the token can see
        /// and cancel runs).
        #[arg(long, requires = "http")]
        http_remote: bool,
        /// A host name the web view answers to besides localhost, 127.0.0.1 and the IPv6
        /// loopback (the name in the browser's address bar); repeatable.
        #[arg(long, value_name = "NAME", requires = "http")]
        http_allow_host: Vec<String>,
        /// Also serve `/metrics` alone, read-only and without the token, on ADDR (loopback
        /// unless --http-remote); every other path is 404 there.
        #[arg(long, value_name = "ADDR", requires = "http")]
        metrics_addr: Option<std::net::SocketAddr>,
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
    /// Print a run's stage logs (stdout, then stderr, each line prefixed with its stage when
    /// every stage is shown); with -f, keep printing lines as they are written, stages that
    /// start later included, until the run ends.
    Logs {
        /// The run: its directory, or the id of a daemon run.
        run: String,
        /// Only this stage (an instance by its full name, `finetune[sample=a]`).
        stage: Option<String>,
        /// Follow the logs until the run ends (Ctrl-C stops following, not the run).
        #[arg(short, long)]
        follow: bool,
        #[command(flatten)]
        daemon: SocketArg,
    },
    /// Log a run directory to MLflow as a finished run with a nested run per stage (params,
    /// metrics at their steps, verdicts and checksums as tags): what `[run] tracking =
    /// "mlflow"` does when a run ends.
    Track {
        /// The run directory.
        run_dir: PathBuf,
        /// The tracking server, http://host:port (default: the plan's tracking_uri, else
        /// $MLFLOW_TRACKING_URI).
        #[arg(long)]
        uri: Option<String>,
        /// The experiment (default: the plan's, else $MLFLOW_EXPERIMENT_NAME, else the
        /// plan's name, else "orchestrate").
        #[arg(long)]
        experiment: Option<String>,
    },
    /// The daemon's GPUs: `gpu release GPU` gives a quarantined GPU back to stages.
    Gpu {
        #[command(subcommand)]
        command: GpuCommand,
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
    /// What this host offers stages and what is missing, with the fix for each: the NVIDIA
    /// driver and GPUs, cgroup v2 and which limits, the built-in worker and its libtorch, Python
    /// with the helper and the frameworks it finds, Slurm, free space where runs go. Exit 0.
    Doctor,
}

/// `orchestrate gpu …`.
#[derive(Subcommand, Debug)]
pub(crate) enum GpuCommand {
    /// Give a GPU that a leak quarantined back to the daemon's stages, once the driver shows
    /// it empty (no process, memory at its idle baseline); otherwise refused (exit 2) with the
    /// process that still holds it.
    Release {
        /// The GPU: its NVML index or its UUID (a unique prefix is enough).
        gpu: String,
        #[command(flatten)]
        daemon: SocketArg,
        /// Print the daemon's answer as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Where the daemon listens.
#[derive(clap::Args, Debug)]
pub(crate) struct SocketArg {
    /// The daemon's socket (default: the per-user path `orchestrate daemon` uses).
    #[arg(long, value_name = "PATH")]
    pub(crate) socket: Option<PathBuf>,
}

impl SocketArg {
    pub(crate) fn path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(orchestrator::daemon::socket::default_path)
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
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
