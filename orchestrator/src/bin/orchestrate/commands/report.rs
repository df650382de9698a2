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
                use std::io::IsTerminal;
                let colour = orchestrator::table::colour_wanted(std::io::stdout().is_terminal());
                let text = orchestrator::report::summary(&report);
                print!("{}", orchestrator::table::paint_status_lines(&text, colour));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
