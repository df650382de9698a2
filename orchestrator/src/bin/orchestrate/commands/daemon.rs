//! `orchestrate daemon`.

use orchestrator::daemon::DaemonConfig;
use orchestrator::exit;
use std::process::ExitCode;

/// Serves plans over the daemon's socket until it is shut down.
pub(crate) fn daemon(config: DaemonConfig) -> ExitCode {
    let runtime = match super::runtime() {
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
