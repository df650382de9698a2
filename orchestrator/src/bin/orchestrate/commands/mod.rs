//! The subcommands, one module each (running a plan is [`run`], the daemon's clients are
//! [`client`]), and what they share: JSON on stdout, errors and their exit statuses, the
//! runtime.

pub(crate) mod client;
pub(crate) mod daemon;
pub(crate) mod doctor;
pub(crate) mod gpu_check;
pub(crate) mod logs;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod status;
pub(crate) mod track;
pub(crate) mod validate;

use orchestrator::exit;
use orchestrator::plan::{load_plan, LoadedPlan};
use orchestrator::store::rundir::RunDirError;
use std::path::Path;
use std::process::ExitCode;

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

fn run_dir_error(e: &RunDirError) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(e.exit_code() as u8)
}

/// Says there is nothing to do: no plan and no subcommand.
pub(crate) fn nothing_to_do() -> ExitCode {
    eprintln!("error: nothing to do: give --plan PLAN, or a subcommand (see --help)");
    ExitCode::from(exit::INVALID_INPUT as u8)
}
