//! The daemon's clients: `submit`, `runs`, `watch`, `wait`, `cancel`, `shutdown`.
//!
//! Exit statuses: a run's own status for `submit --watch/--wait`, `watch` and `wait` (0 only
//! if it succeeded); 2 for a plan the daemon refused, an unknown run id or a `cancel` of a run
//! that has already finished; 4 when the daemon
//! cannot be reached or answers with an error of its own.

use orchestrator::daemon::client::{render_event, Client, ClientError, V};
use orchestrator::exit;
use protocol::daemon::{ErrorCode, PlanInput, Request, Response, RunInfo, ShutdownMode};
use std::path::Path;
use std::process::ExitCode;

fn code(n: i32) -> ExitCode {
    ExitCode::from(n.clamp(0, 255) as u8)
}

fn failed(e: ClientError) -> ExitCode {
    eprintln!("error: {e}");
    code(exit::RUN_ERROR)
}

/// Prints an error answer and gives its exit status.
fn refused(code_: ErrorCode, error: &str) -> ExitCode {
    eprintln!("error: {error}");
    match code_ {
        ErrorCode::InvalidPlan | ErrorCode::NotFound | ErrorCode::AlreadyFinished => {
            code(exit::INVALID_INPUT)
        }
        _ => code(exit::RUN_ERROR),
    }
}

/// The exit status of an answer other than the one asked for: an error answer's (said
/// first), or 4 for an answer that makes no sense here or none at all.
fn not_expected(answer: Result<Response, ClientError>) -> ExitCode {
    match answer {
        Ok(Response::Error { code: c, error, .. }) => refused(c, &error),
        Ok(other) => failed(ClientError::Protocol(format!(
            "unexpected answer {other:?}"
        ))),
        Err(e) => failed(e),
    }
}

fn connect(socket: &Path) -> Result<Client, ExitCode> {
    Client::connect(socket).map_err(failed)
}

fn print_json(response: &Response) {
    println!("{}", serde_json::to_string(response).unwrap_or_default());
}

fn outcome(run: &RunInfo) -> ExitCode {
    code(run.exit_code.unwrap_or(exit::RUN_ERROR))
}

/// Streams events until the run's end; its exit status.
fn follow(client: &mut Client, id: &str, from: u64, json: bool) -> ExitCode {
    if let Err(e) = client.send(&Request::Watch {
        v: V,
        id: id.to_string(),
        from,
    }) {
        return failed(e);
    }
    loop {
        match client.receive() {
            Ok(response @ Response::Event { .. }) => {
                if json {
                    print_json(&response);
                } else if let Response::Event { event, .. } = &response {
                    eprint!("{}", render_event(event));
                }
            }
            Ok(Response::Finished { run, .. }) => {
                if json {
                    print_json(&Response::Finished {
                        v: V,
                        id: id.to_string(),
                        run: run.clone(),
                    });
                } else {
                    println!("{}: {} ({})", run.id, run.state, run.run_dir);
                }
                return outcome(&run);
            }
            other => return not_expected(other),
        }
    }
}

/// `orchestrate submit`.
pub(crate) fn submit(
    socket: &Path,
    plan: &Path,
    watch: bool,
    wait: bool,
    json: bool,
    client_id: Option<String>,
    priority: i32,
) -> ExitCode {
    let path = match std::path::absolute(plan) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {}: {e}", plan.display());
            return code(exit::INVALID_INPUT);
        }
    };
    let mut client = match connect(socket) {
        Ok(c) => c,
        Err(c) => return c,
    };
    let answer = client.call(&Request::Submit {
        v: V,
        plan: PlanInput::Path(path.display().to_string()),
        base_dir: None,
        client_id,
        priority,
    });
    let id = match answer {
        Ok(response @ Response::Submitted { .. }) => {
            if json {
                print_json(&response);
            }
            let Response::Submitted {
                id,
                run_dir,
                existing,
                ..
            } = response
            else {
                unreachable!()
            };
            if !json {
                let again = if existing { " (submitted before)" } else { "" };
                println!("{id}{again}");
                eprintln!("run directory: {run_dir}");
            }
            id
        }
        other => return not_expected(other),
    };
    if watch {
        return follow(&mut client, &id, 0, json);
    }
    if wait {
        return wait_on(&mut client, &id, json);
    }
    ExitCode::SUCCESS
}

fn wait_on(client: &mut Client, id: &str, json: bool) -> ExitCode {
    match client.call(&Request::Wait {
        v: V,
        id: id.to_string(),
    }) {
        Ok(response @ Response::Finished { .. }) => {
            if json {
                print_json(&response);
            }
            let Response::Finished { run, .. } = response else {
                unreachable!()
            };
            if !json {
                println!("{}: {} ({})", run.id, run.state, run.run_dir);
            }
            outcome(&run)
        }
        other => not_expected(other),
    }
}

/// `orchestrate runs`.
pub(crate) fn runs(socket: &Path, json: bool) -> ExitCode {
    let mut client = match connect(socket) {
        Ok(c) => c,
        Err(c) => return c,
    };
    match client.call(&Request::List { v: V }) {
        Ok(response @ Response::Runs { .. }) => {
            if json {
                print_json(&response);
                return ExitCode::SUCCESS;
            }
            let Response::Runs { runs, .. } = response else {
                unreachable!()
            };
            let width = orchestrator::table::column_width("id", runs.iter().map(|r| r.id.as_str()));
            let states = runs.iter().map(|r| r.state.as_str());
            let state_w = orchestrator::table::column_width("state", states);
            println!(
                "{:<width$}  {:<state_w$} {:>9}  waiting / directory",
                "id", "state", "stages"
            );
            for r in &runs {
                let detail = r
                    .waiting
                    .first()
                    .cloned()
                    .unwrap_or_else(|| r.run_dir.clone());
                println!(
                    "{:<width$}  {:<state_w$} {:>4}/{:<4}  {detail}",
                    r.id,
                    r.state.as_str(),
                    r.succeeded,
                    r.stages
                );
            }
            ExitCode::SUCCESS
        }
        other => not_expected(other),
    }
}

/// `orchestrate watch`.
pub(crate) fn watch(socket: &Path, id: &str, from: u64, json: bool) -> ExitCode {
    match connect(socket) {
        Ok(mut client) => follow(&mut client, id, from, json),
        Err(c) => c,
    }
}

/// `orchestrate wait`.
pub(crate) fn wait(socket: &Path, id: &str, json: bool) -> ExitCode {
    match connect(socket) {
        Ok(mut client) => wait_on(&mut client, id, json),
        Err(c) => c,
    }
}

/// `orchestrate cancel`.
pub(crate) fn cancel(socket: &Path, id: &str, kill: bool) -> ExitCode {
    let mut client = match connect(socket) {
        Ok(c) => c,
        Err(c) => return c,
    };
    match client.call(&Request::Cancel {
        v: V,
        id: id.to_string(),
        kill,
    }) {
        Ok(Response::Cancelling { .. }) => {
            eprintln!("{id}: cancelling");
            ExitCode::SUCCESS
        }
        other => not_expected(other),
    }
}

/// `orchestrate shutdown`.
pub(crate) fn shutdown(socket: &Path, cancel: bool) -> ExitCode {
    let mut client = match connect(socket) {
        Ok(c) => c,
        Err(c) => return c,
    };
    let mode = if cancel {
        ShutdownMode::Cancel
    } else {
        ShutdownMode::Drain
    };
    match client.call(&Request::Shutdown { v: V, mode }) {
        Ok(Response::ShuttingDown { running, .. }) => {
            if cancel {
                eprintln!(
                    "the daemon is stopping its {running} unfinished run(s) and then itself; they resume when a daemon starts again with the same --runs-dir"
                );
            } else {
                eprintln!("the daemon stops after its {running} unfinished run(s) end");
            }
            ExitCode::SUCCESS
        }
        other => not_expected(other),
    }
}
