//! `orchestrate report`.

use super::print_json;
use std::path::Path;
use std::process::ExitCode;

/// Shows the report of the run in `run_dir`: a table per stage, or its JSON.
pub(crate) fn report(run_dir: &Path, json: bool) -> ExitCode {
    match orchestrator::report::load_for_display(run_dir) {
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
