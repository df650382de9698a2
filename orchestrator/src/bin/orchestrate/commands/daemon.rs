//! `orchestrate daemon`.

use orchestrator::daemon::DaemonConfig;
use orchestrator::exit;
use orchestrator::web::WebConfig;
use std::process::ExitCode;

/// Serves plans over the daemon's socket until it is shut down, and the web view beside it
/// when `web` asks for one (started with a handle to the daemon, once its runs are recovered).
pub(crate) fn daemon(config: DaemonConfig, web: Option<WebConfig>) -> ExitCode {
    let runtime = match super::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let local = tokio::task::LocalSet::new();
    let beside = move |daemon| {
        web.map(|web| orchestrator::web::start(daemon, &web))
            .transpose()
            .map_err(|e| e.to_string())
    };
    match local.block_on(&runtime, orchestrator::daemon::serve(config, beside)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit::RUN_ERROR as u8)
        }
    }
}
