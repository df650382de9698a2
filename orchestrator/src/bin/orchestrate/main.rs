//! `orchestrate`: the command line. Thin: parsing ([`cli`]), logging set-up, exit codes; the
//! subcommands are in [`commands`], the work in the `orchestrator` library.
// The doc comments of the command-line types are `--help` text, where `<name>` is the usual
// placeholder, not an HTML tag.
#![allow(rustdoc::invalid_html_tags)]

use clap::Parser;
use cli::{Cli, Command, GpuCommand, LogFormat, RunArgs};
use commands::client;
use std::path::PathBuf;
use std::process::ExitCode;

mod cli;
mod commands;

fn main() -> ExitCode {
    // Before any thread exists, so that every thread blocks it (see `reaper`).
    orchestrator::process::reaper::block_child_signals();
    // Nothing this process starts inherits what it inherited (see `inherited`).
    orchestrator::process::inherited::keep_to_ourselves();
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
    run_command(cli)
}

/// Carries out the command line's command; its exit status.
fn run_command(cli: Cli) -> ExitCode {
    let Some(command) = cli.command else {
        return match cli.run.plan {
            Some(_) => commands::run::run_plan(cli.run, cli.log_format),
            None => commands::nothing_to_do(),
        };
    };
    match command {
        Command::Validate { plan } => commands::validate::validate(&plan),
        Command::Schema => commands::validate::schema(),
        Command::Doctor => commands::doctor::doctor(),
        Command::GpuCheck {
            wait,
            max_used_mib,
            json,
        } => commands::gpu_check::gpu_check(wait.map(|w| w.get()), max_used_mib, json),
        Command::Resume { run_dir, quiet } => {
            let args = RunArgs {
                plan: None,
                run_dir: Some(run_dir),
                worker: cli.run.worker,
                quiet,
                resume: true,
                follow: cli.run.follow,
            };
            commands::run::run_plan(args, cli.log_format)
        }
        Command::Report { run_dir, json } => commands::report::report(&run_dir, json),
        Command::Status {
            run_dir,
            plan,
            json,
        } => commands::status::status(&run_dir, plan.as_deref(), json),
        Command::Daemon {
            socket,
            runs_dir,
            idle_timeout,
            http,
            http_remote,
            http_allow_host,
            metrics_addr,
        } => commands::daemon::daemon(
            orchestrator::daemon::DaemonConfig {
                socket: socket.unwrap_or_else(orchestrator::daemon::socket::default_path),
                runs_dir: runs_dir.unwrap_or_else(orchestrator::daemon::default_runs_dir),
                idle_timeout: idle_timeout.get(),
                worker: cli.run.worker,
            },
            http.map(|addr| orchestrator::web::WebConfig {
                addr,
                allow_hosts: http_allow_host,
                remote: http_remote,
                metrics_addr,
            }),
        ),
        Command::Submit {
            plan,
            daemon,
            watch,
            wait,
            json,
            id,
            priority,
        } => client::submit(&daemon.path(), &plan, watch, wait, json, id, priority),
        Command::Runs { daemon, json } => client::runs(&daemon.path(), json),
        Command::Track {
            run_dir,
            uri,
            experiment,
        } => commands::track::track(&run_dir, uri, experiment),
        Command::Logs {
            run,
            stage,
            follow,
            daemon,
        } => commands::logs::logs(&run, stage.as_deref(), follow, &daemon.path()),
        Command::Watch {
            id,
            daemon,
            from,
            json,
        } => client::watch(&daemon.path(), &id, from, json),
        Command::Wait { id, daemon, json } => client::wait(&daemon.path(), &id, json),
        Command::Cancel { id, daemon, kill } => client::cancel(&daemon.path(), &id, kill),
        Command::Shutdown { daemon, cancel } => client::shutdown(&daemon.path(), cancel),
        Command::Gpu {
            command: GpuCommand::Release { gpu, daemon, json },
        } => client::release_gpu(&daemon.path(), &gpu, json),
    }
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
