//! `stage-worker`: runs one built-in stage (train or eval) of an orchestrate pipeline and exits.
//! See `stage-worker --help` for the contract.

mod boot;
mod checkpoint;
mod data;
mod device;
mod events;
mod failure;
mod kernels;
mod log;
mod model;
mod stages;
#[cfg(test)]
mod testutil;

use clap::{CommandFactory, Parser};
use events::EventSink;
use failure::{readable_message, Failure};
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;

fn main() {
    log::start();
    dispatch(boot::cli::Cli::parse());
}

/// Runs `argv` as if it were this process's command line (a worker forked by the fork
/// server, or a standby it adopted), then exits. Handed down to the fork server.
fn run_command_line(argv: &[String]) -> ! {
    let cli = boot::cli::Cli::try_parse_from(argv).unwrap_or_else(|e| e.exit());
    dispatch(cli);
    std::process::exit(0)
}

fn dispatch(cli: boot::cli::Cli) {
    match (&cli.command, &cli.spec) {
        (Some(boot::cli::Command::Hold(args)), _) => {
            if let Err(e) = boot::hold::run(args) {
                log!("hold: {e}");
                std::process::exit(1);
            }
        }
        (Some(boot::cli::Command::CheckKernels), _) => {
            std::process::exit(stages::check_kernels::run())
        }
        (Some(boot::cli::Command::LlamaLogits(args)), _) => {
            if let Err(e) = stages::llama::write_logits(&args.model, &args.ids, &args.out) {
                log!("llama-logits: {}", e.message);
                std::process::exit(e.kind.exit_code());
            }
        }
        (Some(boot::cli::Command::ForkServer(args)), _) => {
            std::process::exit(boot::forkserver::serve(args.fd, run_command_line));
        }
        (None, Some(spec)) => run_stage(spec),
        (None, None) => {
            boot::cli::Cli::command()
                .error(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "no stage spec: pass --spec PATH or set ORCHESTRATE_SPEC",
                )
                .exit();
        }
    }
}

/// Runs the stage at `spec`, sends `done` or `failed`, and exits with the matching status.
fn run_stage(spec: &Path) -> ! {
    let mut sink = match EventSink::from_env() {
        Ok(sink) => sink,
        Err(e) => {
            log!("{e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = boot::signals::install() {
        log!("cannot install the SIGTERM handler: {e}");
    }
    // libtorch reports errors by panicking through tch; log one readable entry and turn the
    // panic into a classified failure below.
    panic::set_hook(Box::new(|info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("panic");
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        log!("internal error{at}: {}", readable_message(text));
    }));
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| stages::run(spec, &mut sink)));
    let failure = match outcome {
        Ok(Ok(())) => {
            sink.done();
            exit_now(0);
        }
        Ok(Err(failure)) => failure,
        Err(payload) => Failure::from_torch(panic_text(payload.as_ref())),
    };
    let message = readable_message(&failure.message);
    log!("failed ({}): {message}", failure.kind.reason());
    sink.failed(&message, failure.kind.reason());
    exit_now(failure.kind.exit_code());
}

/// Ends the process with `code` without running libtorch's exit-time destructors (tearing
/// down its thread pools and allocators took about 0.4 s): every output is already durable
/// and every event sent, and the OS reclaims the rest, device memory included.
fn exit_now(code: i32) -> ! {
    use std::io::Write;
    if boot::warmup::tracing() {
        log!("exiting at {:.4}", log::unix_now());
    }
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit has no preconditions; nothing after this point needs to run.
    unsafe { libc::_exit(code) }
}

/// The text of a panic payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        "panic with a non-text payload".into()
    }
}
