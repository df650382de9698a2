//! One client connection: newline-delimited JSON requests in, answers out.
//!
//! Promises: a peer of another user (not root) is refused before anything else; a line longer than
//! [`MAX_REQUEST_BYTES`] is refused and the connection closed (the stream cannot be resynced), and
//! so is a connection whose unfinished line would take the daemon's connections together over
//! [`MAX_BUFFERED_REQUEST_BYTES`] (an idle connection holds no buffer); a request that names a key
//! twice is refused; a connection that sends no complete request for the idle timeout is closed (a
//! half line that stalls, a half-open peer); an answer that cannot be written within
//! [`WRITE_TIMEOUT`] closes the connection (a client that does not read). A bad request gets an
//! error answer naming the problem and the connection goes on. Each connection is its own task, so
//! none of this touches running stages or other clients.

use super::Daemon;
use crate::attempt::launch::CancelLevel;
use protocol::daemon::{
    ErrorCode, Request, Response, RunInfo, DAEMON_PROTOCOL_VERSION, MAX_BUFFERED_REQUEST_BYTES,
    MAX_REQUEST_BYTES,
};
use std::rc::Rc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

/// An answer that cannot be written in this time closes the connection.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once; more are refused.
pub const MAX_CONNECTIONS: usize = 4096;

const V: u32 = DAEMON_PROTOCOL_VERSION;

fn error(code: ErrorCode, text: impl Into<String>) -> Response {
    Response::Error {
        v: V,
        code,
        error: text.into(),
    }
}

/// Writes one answer line; `false` when the peer is gone or too slow.
async fn send(stream: &mut UnixStream, response: &Response) -> bool {
    let Ok(mut line) = serde_json::to_vec(response) else {
        return false;
    };
    line.push(b'\n');
    matches!(
        tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&line)).await,
        Ok(Ok(()))
    )
}

/// Serves one connection to its end.
pub async fn serve(daemon: Rc<Daemon>, mut stream: UnixStream) {
    let uid = stream.peer_cred().map(|c| c.uid()).unwrap_or(u32::MAX);
    if !super::socket::peer_allowed(uid) {
        tracing::warn!(uid, "refused a connection from another user");
        let _ = send(
            &mut stream,
            &error(
                ErrorCode::PermissionDenied,
                format!(
                    "permission denied: uid {uid} may not use this daemon (it serves uid {} and root)",
                    nix::unistd::getuid().as_raw()
                ),
            ),
        )
        .await;
        return;
    }
    if daemon.connections.get() >= MAX_CONNECTIONS {
        let _ = send(
            &mut stream,
            &error(
                ErrorCode::Internal,
                format!("too many connections (at most {MAX_CONNECTIONS}); try again"),
            ),
        )
        .await;
        return;
    }
    daemon.connections.set(daemon.connections.get() + 1);
    let hello = Response::Hello {
        v: V,
        server: format!("orchestrate {}", env!("CARGO_PKG_VERSION")),
        pid: std::process::id(),
    };
    if send(&mut stream, &hello).await {
        requests(&daemon, &mut stream).await;
    }
    daemon.connections.set(daemon.connections.get() - 1);
}

/// Bytes read from a connection at a time.
const READ_CHUNK: usize = 64 << 10;

async fn requests(daemon: &Rc<Daemon>, stream: &mut UnixStream) {
    let mut buf: Vec<u8> = Vec::new();
    let mut share = daemon.request_budget.share();
    loop {
        // Serve every complete line in the buffer.
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            // One read can bring a whole over-long line, end included: it is refused all the
            // same, whatever the reads' sizes were.
            if end > MAX_REQUEST_BYTES {
                drop(buf);
                drop(share);
                refuse(stream, &too_long()).await;
                return;
            }
            let line: Vec<u8> = buf.drain(..=end).collect();
            let line = &line[..line.len() - 1];
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if !handle(daemon, stream, line).await {
                return;
            }
        }
        // A connection between requests holds no buffer.
        if buf.is_empty() {
            buf = Vec::new();
        }
        share.set(buf.capacity());
        if buf.len() > MAX_REQUEST_BYTES {
            drop(buf);
            drop(share);
            refuse(stream, &too_long()).await;
            return;
        }
        let read = tokio::time::timeout(daemon.config.idle_timeout, stream.readable()).await;
        match read {
            Ok(Err(_)) => return,
            Ok(Ok(())) => {
                let wanted = buf.len() + READ_CHUNK;
                if !share.allows(buf.capacity().max(wanted)) {
                    drop(buf);
                    drop(share);
                    refuse(stream, &over_budget()).await;
                    return;
                }
                buf.reserve(READ_CHUNK);
                share.set(buf.capacity());
                match stream.try_read_buf(&mut buf) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
            Err(_) => {
                let _ = send(
                    stream,
                    &error(
                        ErrorCode::Malformed,
                        format!(
                            "no complete request for {}s: closing the connection",
                            daemon.config.idle_timeout.as_secs_f64()
                        ),
                    ),
                )
                .await;
                return;
            }
        }
    }
}

fn too_long() -> Response {
    error(
        ErrorCode::TooLarge,
        format!(
            "request line longer than {MAX_REQUEST_BYTES} bytes; send a plan that big as a path (\"plan\": {{\"path\": …}})"
        ),
    )
}

/// How long a refused connection's further bytes are read and dropped, so that its client,
/// still sending, gets the answer rather than a reset connection.
const REFUSED_DRAIN: Duration = Duration::from_secs(2);

fn over_budget() -> Response {
    error(
        ErrorCode::TooLarge,
        format!(
            "the daemon holds {} MiB of unfinished requests, its most for all connections together: closing this connection; send the request again later, or a big plan as a path (\"plan\": {{\"path\": …}})",
            MAX_BUFFERED_REQUEST_BYTES >> 20
        ),
    )
}

/// Sends `answer`, then reads and drops what the client still sends (for at most
/// [`REFUSED_DRAIN`], holding nothing), so that it reads the answer before the close.
async fn refuse(stream: &mut UnixStream, answer: &Response) {
    if !send(stream, answer).await {
        return;
    }
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(REFUSED_DRAIN, async {
        loop {
            if stream.readable().await.is_err() {
                return;
            }
            match stream.try_read(&mut sink) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    })
    .await;
}

const KNOWN: [&str; 8] = [
    "submit",
    "status",
    "list",
    "watch",
    "wait",
    "cancel",
    "shutdown",
    "release_gpu",
];

/// Parses a line into a request, or the error answer that says why it is not one.
fn parse(line: &[u8]) -> Result<Request, Box<Response>> {
    super::strict_json::check_unique_keys(line).map_err(|e| {
        let text = if e.is_data() {
            format!("{e}: a request names each key once")
        } else {
            format!("not JSON: {e}")
        };
        Box::new(error(ErrorCode::Malformed, text))
    })?;
    let value: serde_json::Value = serde_json::from_slice(line)
        .map_err(|e| Box::new(error(ErrorCode::Malformed, format!("not JSON: {e}"))))?;
    let Some(object) = value.as_object() else {
        return Err(Box::new(error(
            ErrorCode::Malformed,
            "a request is a JSON object with \"v\" and \"type\"",
        )));
    };
    match object.get("v").map(|v| (v, v.as_u64())) {
        Some((_, Some(v))) if v == u64::from(V) => {}
        Some((_, Some(v))) => {
            return Err(Box::new(error(
                ErrorCode::Version,
                format!("protocol version {v} is not spoken here: this daemon speaks version {V}"),
            )))
        }
        Some((other, None)) => {
            return Err(Box::new(error(
                ErrorCode::Version,
                format!(
                    "\"v\" is {other}, not a protocol version: write it as a whole number (\"v\": {V}); this daemon speaks version {V}"
                ),
            )))
        }
        None => {
            return Err(Box::new(error(
                ErrorCode::Version,
                format!(
                    "the request has no \"v\" (protocol version); this daemon speaks version {V}"
                ),
            )))
        }
    }
    let kind = object
        .get("type")
        .and_then(|t| t.as_str())
        .unwrap_or("")
        .to_string();
    if !KNOWN.contains(&kind.as_str()) {
        return Err(Box::new(error(
            ErrorCode::UnknownType,
            format!(
                "unknown request type {:?}; known: {}",
                kind,
                KNOWN.join(", ")
            ),
        )));
    }
    serde_json::from_value(value).map_err(|e| {
        Box::new(error(
            ErrorCode::Malformed,
            format!("bad `{kind}` request: {e}"),
        ))
    })
}

fn not_found(id: &str) -> Response {
    error(ErrorCode::NotFound, format!("no run with id {id:?}"))
}

/// Handles one request line; `false` ends the connection.
async fn handle(daemon: &Rc<Daemon>, stream: &mut UnixStream, line: &[u8]) -> bool {
    let request = match parse(line) {
        Ok(r) => r,
        Err(answer) => return send(stream, &answer).await,
    };
    let answer = match request {
        Request::Submit {
            plan,
            base_dir,
            client_id,
            priority,
            ..
        } => {
            if let Some(existing) = client_id
                .as_deref()
                .and_then(|c| daemon.registry.borrow().by_client(c).map(|r| r.info()))
            {
                Response::Submitted {
                    v: V,
                    id: existing.id,
                    run_dir: existing.run_dir,
                    existing: true,
                }
            } else if daemon.shutting_down.get() {
                error(
                    ErrorCode::ShuttingDown,
                    "the daemon is shutting down and takes no new runs",
                )
            } else {
                match super::accept_plan(plan, base_dir).await {
                    Err(report) => error(ErrorCode::InvalidPlan, report.to_string()),
                    Ok(accepted) => start_accepted(daemon, accepted, client_id, priority),
                }
            }
        }
        Request::Status { id: Some(id), .. } => match daemon.registry.borrow().get(&id) {
            Some(run) => Response::Runs {
                v: V,
                runs: vec![run.info()],
            },
            None => not_found(&id),
        },
        Request::Status { id: None, .. } | Request::List { .. } => Response::Runs {
            v: V,
            runs: daemon.registry.borrow().all().map(|r| r.info()).collect(),
        },
        Request::Cancel { id, kill, .. } => match daemon.registry.borrow().get(&id) {
            Some(run) if run.finished() => error(
                ErrorCode::AlreadyFinished,
                format!(
                    "run {id} has already finished ({}, exit status {}): there is nothing to cancel",
                    run.state,
                    run.exit_code.unwrap_or(crate::exit::RUN_ERROR)
                ),
            ),
            Some(run) => {
                let level = if kill {
                    CancelLevel::Kill
                } else {
                    CancelLevel::Graceful
                };
                run.cancel.send_replace(level);
                Response::Cancelling { v: V, id }
            }
            None => not_found(&id),
        },
        Request::Shutdown { mode, .. } => {
            let running = daemon.shutdown(mode);
            Response::ShuttingDown { v: V, running }
        }
        Request::ReleaseGpu { gpu, .. } => match daemon.host.release_quarantined_gpu(&gpu) {
            Ok(g) => Response::GpuReleased {
                v: V,
                index: g.index,
                uuid: g.uuid,
            },
            Err(refused) => {
                use crate::host::quarantine_release::ReleaseRefused;
                let code = match refused {
                    ReleaseRefused::Unknown(_) => ErrorCode::NotFound,
                    _ => ErrorCode::Refused,
                };
                error(code, refused.to_string())
            }
        },
        Request::Wait { id, .. } => outcome(daemon, &id).await,
        Request::Watch { id, from, .. } => return watch(daemon, stream, &id, from).await,
    };
    send(stream, &answer).await
}

/// Waits for run `id` to end; its final state (None: no such run).
async fn finished(daemon: &Rc<Daemon>, id: &str) -> Option<RunInfo> {
    let mut done = daemon.registry.borrow().get(id)?.done.subscribe();
    let _ = done.wait_for(|d| *d).await;
    daemon.registry.borrow().get(id).map(|r| r.info())
}

/// Waits for run `id` to end; the answer that says how. A run the daemon's own shutdown
/// stopped has no outcome yet (the next daemon resumes it): its waiters are told so, with a
/// `shutting_down` error, as a daemon killed under them would leave them with no answer.
async fn outcome(daemon: &Rc<Daemon>, id: &str) -> Response {
    let Some(run) = finished(daemon, id).await else {
        return not_found(id);
    };
    let stopped = daemon
        .registry
        .borrow()
        .get(id)
        .is_some_and(|r| r.stopped_by_daemon());
    if stopped {
        return error(
            ErrorCode::ShuttingDown,
            format!(
                "the daemon is shutting down and stopped run {id}; it resumes when a daemon starts again with the same --runs-dir ({})",
                daemon.config.runs_dir.display()
            ),
        );
    }
    Response::Finished {
        v: V,
        id: id.to_string(),
        run,
    }
}

/// Sends the events numbered `next` and later, in order; `false` when the client is gone.
async fn send_events(
    stream: &mut UnixStream,
    id: &str,
    events: Vec<super::registry::Numbered>,
    next: &mut u64,
) -> bool {
    for (seq, event) in events {
        if seq < *next {
            continue; // already sent
        }
        *next = seq + 1;
        let answer = Response::Event {
            v: V,
            id: id.to_string(),
            seq,
            event: std::sync::Arc::unwrap_or_clone(event),
        };
        if !send(stream, &answer).await {
            return false;
        }
    }
    true
}

/// Sends the events of run `id`'s log from `*next` up to `upto` (not included), a piece at a
/// time: each piece is read only once the one before is written, so a client that does not
/// read holds one piece, and the daemon's thread reads at most one piece per turn. `false` when
/// the client is gone.
async fn replay(
    stream: &mut UnixStream,
    id: &str,
    log: &mut super::event_log::EventReader,
    next: &mut u64,
    upto: u64,
) -> bool {
    while *next < upto {
        let piece = log.piece(*next, upto);
        if !send_events(stream, id, piece.events, next).await {
            return false;
        }
        if piece.done {
            break;
        }
        tokio::task::yield_now().await;
    }
    true
}

/// Streams run `id`'s events from `from`, then its outcome: those it had when asked from its
/// event file (see [`replay`]), the later ones as they come (from the file again if this
/// watcher falls behind).
async fn watch(daemon: &Rc<Daemon>, stream: &mut UnixStream, id: &str, from: u64) -> bool {
    let Some((path, (mut upto, mut live))) = daemon
        .registry
        .borrow()
        .get(id)
        .map(|r| (r.events_path(), r.watch_point()))
    else {
        return send(stream, &not_found(id)).await;
    };
    let mut log = super::event_log::EventReader::new(&path);
    let mut next = from;
    loop {
        if !replay(stream, id, &mut log, &mut next, upto).await {
            return false;
        }
        let Some(receiver) = live.as_mut() else {
            break;
        };
        let received = receiver.recv().await;
        // The run's count now: what this watcher missed is in the file below it.
        let count = daemon.registry.borrow().get(id).map(|r| r.event_count());
        match (received, count) {
            (Ok(numbered), _) => {
                if !send_events(stream, id, vec![numbered], &mut next).await {
                    return false;
                }
            }
            (Err(_), None) => break,
            // Fell behind (catch up from the file) or the run ended (send what is left).
            (Err(tokio::sync::broadcast::error::RecvError::Lagged(_)), Some(count)) => upto = count,
            (Err(tokio::sync::broadcast::error::RecvError::Closed), Some(count)) => {
                upto = count;
                live = None;
            }
        }
    }
    send(stream, &outcome(daemon, id).await).await
}

/// Starts a validated plan, unless a submit with the same client id won while it was being
/// validated (that run is the answer) or it cannot run on this host (refused).
fn start_accepted(
    daemon: &Rc<Daemon>,
    accepted: super::Accepted,
    client_id: Option<String>,
    priority: i32,
) -> Response {
    let raced = client_id
        .as_deref()
        .and_then(|c| daemon.registry.borrow().by_client(c).map(|r| r.info()));
    if let Some(existing) = raced {
        return Response::Submitted {
            v: V,
            id: existing.id,
            run_dir: existing.run_dir,
            existing: true,
        };
    }
    if let Err(refusal) = daemon.preflight(&accepted) {
        return error(ErrorCode::Refused, refusal.to_string());
    }
    match daemon.start_run(accepted, client_id, priority) {
        Ok((id, dir)) => Response::Submitted {
            v: V,
            id,
            run_dir: dir.display().to_string(),
            existing: false,
        },
        Err(why) => error(ErrorCode::Internal, why.to_string()),
    }
}
