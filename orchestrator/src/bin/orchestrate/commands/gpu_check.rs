//! `orchestrate gpu-check`.

use super::print_json;
use orchestrator::exit;
use std::process::ExitCode;
use std::time::Duration;

/// Checks this machine's GPUs (waiting up to `wait` for them to become clean): exit 0 clean,
/// 3 not clean, 4 NVML unavailable.
pub(crate) fn gpu_check(wait: Option<Duration>, max_used_mib: u64, json: bool) -> ExitCode {
    match orchestrator::gpu::check::run(max_used_mib << 20, wait) {
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
    }
}
