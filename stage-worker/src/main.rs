//! `stage-worker`: runs one built-in stage (train or eval) of an orchestrate pipeline and exits.
//! See `stage-worker --help` for the contract.

mod checkpoint;
mod cli;
mod data;
mod device;
mod eval;
mod events;
mod failure;
mod fsio;
mod model;
mod optim;
mod params;
mod progress;
mod rng;
mod signals;
mod spec;
mod stage;
#[cfg(test)]
mod testutil;
mod train;

use clap::Parser;
use events::EventSink;
use failure::Failure;
use std::panic::{self, AssertUnwindSafe};

fn main() {
    let cli = cli::Cli::parse();
    let mut sink = match EventSink::from_env() {
        Ok(sink) => sink,
        Err(e) => {
            eprintln!("stage-worker: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = signals::install() {
        eprintln!("stage-worker: cannot install the SIGTERM handler: {e}");
    }
    // libtorch reports errors by panicking through tch; keep the log to one readable entry
    // and turn the panic into a classified failure below.
    panic::set_hook(Box::new(|info| {
        eprintln!("stage-worker: internal error: {info}");
    }));
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| stage::run(&cli.spec, &mut sink)));
    let failure = match outcome {
        Ok(Ok(())) => {
            sink.done();
            std::process::exit(0);
        }
        Ok(Err(failure)) => failure,
        Err(payload) => Failure::from_torch(panic_text(payload.as_ref())),
    };
    let message = first_paragraph(&failure.message);
    eprintln!(
        "stage-worker: failed ({}): {message}",
        failure.kind.reason()
    );
    sink.failed(&message, failure.kind.reason());
    std::process::exit(failure.kind.exit_code());
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

/// A libtorch message without its C++ stack trace (which stays in the stderr log).
fn first_paragraph(message: &str) -> String {
    let cut = message
        .find("\nException raised from")
        .or_else(|| message.find("Exception raised from"))
        .unwrap_or(message.len());
    let text = message[..cut].trim_end();
    const MAX: usize = 2_000;
    if text.len() > MAX {
        let mut end = MAX;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &text[..end])
    } else {
        text.to_string()
    }
}
