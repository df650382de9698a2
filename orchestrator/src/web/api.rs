//! The routes' answers. Every request is checked by [`Auth::gate`](super::auth::Auth::gate)
//! before its route is looked at further; the route is found in [`ROUTES`] and its handler
//! chosen by the route's name.

use super::admission::Ticket;
use super::auth::Pass;
use super::cadence::KEEPALIVE;
use super::conn::{self, Seat};
use super::http::{self, EventSink, Request, Response};
use super::state::Web;
use crate::attempt::launch::CancelLevel;
use protocol::web::{Route, ROUTES};
use std::rc::Rc;
use tokio::net::TcpStream;

const PAGE: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/app.css");

/// The most of a stage's log one answer carries (its end).
pub const LOG_TAIL_BYTES: u64 = 64 << 10;
/// Memory samples per GPU in one answer.
pub const MEMORY_POINTS: usize = 2000;

/// The route `request` is for, and its path parameters.
pub fn find(request: &Request) -> Option<(&'static Route, Vec<String>)> {
    ROUTES
        .iter()
        .find_map(|r| protocol::web::match_path(r.path, &request.path).map(|p| (r, p)))
}

/// Serves one connection, request after request (see [`super::conn`]). The connection is
/// admitted (out of the budget of those without the token, see [`super::admission`]) once the
/// gate passes one of its requests.
pub async fn serve(web: Rc<Web>, stream: TcpStream, ticket: Ticket) {
    conn::serve(stream, ticket, move |request, seat| {
        let web = web.clone();
        async move { route(&web, &request, &seat).await }
    })
    .await
}

/// The answer to `request`, the gate's checks first.
async fn route(web: &Rc<Web>, request: &Request, seat: &Seat) -> Response {
    let found = find(request);
    match web.auth.gate(request, found.as_ref().map(|(r, _)| *r)) {
        Err(refused) => refused,
        Ok(_) if !seat.admit() => Response::text(
            503,
            "busy: too many connections being served at once; try again",
        )
        .closing(),
        Ok(Pass::SetCookie { location }) => Response::text(303, "see the page")
            .with("Set-Cookie", web.auth.set_cookie())
            .with("Location", location),
        Ok(Pass::Serve) => match found {
            None => Response::text(404, format!("no such page: {}", request.path)),
            Some((route, _)) if route.name == "runs_events" => super::runs_stream::serve(web),
            Some((route, params)) if route.name == "events" => events(web, request, &params[0]),
            Some((route, params)) => answer(web, route, &params, request).await,
        },
    }
}

/// The answer of every route but the event stream.
async fn answer(web: &Rc<Web>, route: &Route, params: &[String], request: &Request) -> Response {
    match route.name {
        "page" => Response::new(200, "text/html; charset=utf-8", PAGE),
        "script" => Response::new(200, "text/javascript; charset=utf-8", SCRIPT),
        "style" => Response::new(200, "text/css; charset=utf-8", STYLE),
        "runs" => runs(web),
        "run" => run(web, &params[0]).await,
        "memory" => memory(web, &params[0]),
        "log" => log(web, &params[0], &params[1], request.param("stream")).await,
        "cancel" => cancel(web, &params[0], request.param("kill") == Some("1")),
        "metrics" => metrics(web),
        other => Response::text(500, format!("route {other} has no handler")),
    }
}

/// `/metrics`: the Prometheus text format.
pub fn metrics(web: &Web) -> Response {
    let now = super::memory::now(&web.memory, &web.daemon.host);
    Response::new(
        200,
        "text/plain; version=0.0.4; charset=utf-8",
        super::metrics::render(&web.daemon, &now),
    )
}

fn not_found(id: &str) -> Response {
    Response::text(404, format!("no run with id {id:?}"))
}

fn runs(web: &Web) -> Response {
    let registry = web.daemon.registry.borrow();
    let tally = web.daemon.tally.borrow();
    let runs: Vec<serde_json::Value> = registry
        .all()
        .map(|r| {
            let info = r.info();
            let gpus = tally.gpus_of(&info.id);
            serde_json::json!({ "info": info, "gpus": gpus })
        })
        .collect();
    Response::json(
        &serde_json::json!({ "runs": runs, "now_unix": crate::timefmt::unix_secs_f64() }),
    )
}

async fn run(web: &Web, id: &str) -> Response {
    let Some(info) = web.daemon.registry.borrow().get(id).map(|r| r.info()) else {
        return not_found(id);
    };
    let dir = std::path::PathBuf::from(&info.run_dir);
    let known = web.stage_meta.borrow().get(id).cloned();
    let (report, stages) = tokio::task::spawn_blocking(move || {
        let stages = known.or_else(|| super::stage_meta::read(&dir).map(std::sync::Arc::new));
        (crate::report::load_for_display(&dir).ok(), stages)
    })
    .await
    .unwrap_or((None, None));
    if let Some(stages) = &stages {
        web.stage_meta
            .borrow_mut()
            .insert(id.to_string(), stages.clone());
    }
    Response::json(
        &serde_json::json!({ "info": info, "report": report, "stages": stages.as_deref() }),
    )
}

fn memory(web: &Web, id: &str) -> Response {
    let Some(info) = web.daemon.registry.borrow().get(id).map(|r| r.info()) else {
        return not_found(id);
    };
    let from = (info.submitted_unix * 1e3) as u64;
    let to = info
        .finished_unix
        .map_or(u64::MAX, |f| (f * 1e3) as u64 + 2_000);
    Response::json(&super::memory::window(
        &web.memory,
        &web.daemon.host,
        from,
        to,
        MEMORY_POINTS,
    ))
}

/// Whether `name` can be a stage's directory name (one path segment, not hidden).
fn safe_segment(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\', '\0'])
}

async fn log(web: &Web, id: &str, stage: &str, stream: Option<&str>) -> Response {
    let Some(dir) = web
        .daemon
        .registry
        .borrow()
        .get(id)
        .map(|r| r.run_dir.clone())
    else {
        return not_found(id);
    };
    let file = match stream.unwrap_or("stderr") {
        "stderr" => "stderr.log",
        "stdout" => "stdout.log",
        other => return Response::text(400, format!("stream {other:?}: ask for stdout or stderr")),
    };
    if !safe_segment(stage) {
        return Response::text(400, format!("{stage:?} is not a stage name"));
    }
    let path = dir.join("stages").join(stage).join(file);
    let read = tokio::task::spawn_blocking(move || tail(&path, LOG_TAIL_BYTES)).await;
    match read {
        Ok(Ok(text)) => Response::new(200, "text/plain; charset=utf-8", text),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Response::text(
            404,
            format!("stage {stage:?} of run {id} has no {file} (yet)"),
        ),
        Ok(Err(e)) => Response::text(500, format!("cannot read {file}: {e}")),
        Err(e) => Response::text(500, format!("cannot read {file}: {e}")),
    }
}

/// The last `max` bytes of a regular file (from a line's start when it was cut).
fn tail(path: &std::path::Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let start = meta.len().saturating_sub(max);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes)?;
    if start > 0 {
        if let Some(nl) = bytes.iter().position(|&b| b == b'\n') {
            bytes.drain(..=nl);
        }
    }
    Ok(bytes)
}

fn cancel(web: &Web, id: &str, kill: bool) -> Response {
    let registry = web.daemon.registry.borrow();
    let Some(run) = registry.get(id) else {
        return not_found(id);
    };
    if run.finished() {
        return Response::text(
            409,
            format!(
                "run {id} has already finished ({}): there is nothing to cancel",
                run.state
            ),
        );
    }
    let level = if kill {
        CancelLevel::Kill
    } else {
        CancelLevel::Graceful
    };
    run.cancel.send_replace(level);
    tracing::info!(run = %id, ?level, "run cancelled from the web view");
    Response::json(&serde_json::json!({ "cancelling": id }))
}

/// One server-sent event.
fn sse(kind: &str, id: Option<u64>, data: &str) -> Vec<u8> {
    let mut out = String::with_capacity(data.len() + 32);
    if let Some(id) = id {
        out.push_str(&format!("id: {id}\n"));
    }
    out.push_str(&format!("event: {kind}\ndata: {data}\n\n"));
    out.into_bytes()
}

/// Streams run `id`'s events, from `?from=` (or after `Last-Event-ID`), as server-sent events:
/// each a `data: {seq, event}` message, the same events and numbers the socket's watchers get
/// (a large run's coalesced: see [`super::feed`]); then `event: end` with the run's final state.
fn events(web: &Rc<Web>, request: &Request, id: &str) -> Response {
    let from = request
        .header("last-event-id")
        .and_then(|s| s.parse::<u64>().ok())
        .map(|n| n + 1)
        .or_else(|| request.param("from").and_then(|s| s.parse().ok()))
        .unwrap_or(0);
    {
        let registry = web.daemon.registry.borrow();
        web.feeds
            .frames
            .retain(|run| registry.get(run).is_some_and(|r| !r.finished()));
    }
    let Some(sub) = super::feed::subscribe(&web.daemon, &web.feeds, id) else {
        return not_found(id);
    };
    let (sink, answer) = http::event_stream();
    tokio::task::spawn_local(stream_events(web.clone(), sink, id.to_string(), sub, from));
    answer
}

/// Writes run `id`'s events from `next` into `sink`: its log up to what the subscription
/// counted, then the feed's batches, then `event: end`; until the page goes.
async fn stream_events(
    web: Rc<Web>,
    sink: EventSink,
    id: String,
    mut sub: super::feed::Subscription,
    mut next: u64,
) {
    let web = &web;
    let id = id.as_str();
    let (upto, large) = (sub.upto, sub.large);
    if !replay_to(web, &sink, id, &mut sub.log, &mut next, upto, large).await {
        return;
    }
    if let Some(mut batches) = sub.batches {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match tokio::time::timeout(KEEPALIVE, batches.recv()).await {
                Err(_) => {
                    if !sink.send(&b": keepalive\n\n"[..]).await {
                        return;
                    }
                }
                Ok(Ok(batch)) => {
                    if let Some(bytes) = batch.after(next) {
                        next = batch.to + 1;
                        if !sink.send(bytes).await {
                            return;
                        }
                    }
                }
                Ok(Err(RecvError::Lagged(_))) => {
                    // This page fell behind its feed: catch up from the run's log.
                    let count = web
                        .daemon
                        .registry
                        .borrow()
                        .get(id)
                        .map(|r| r.event_count());
                    let Some(count) = count else { break };
                    if !replay_to(web, &sink, id, &mut sub.log, &mut next, count, large).await {
                        return;
                    }
                }
                Ok(Err(RecvError::Closed)) => break,
            }
        }
    }
    let mut done = match web.daemon.registry.borrow().get(id) {
        Some(r) => r.done.subscribe(),
        None => return,
    };
    let _ = done.wait_for(|d| *d).await;
    web.feeds.frames.forget(id);
    let info = web.daemon.registry.borrow().get(id).map(|r| r.info());
    let data = serde_json::to_string(&info).unwrap_or_default();
    let _ = sink.send(sse("end", None, &data)).await;
}

/// Writes run `id`'s events from `*next` up to `upto` from its log, a piece at a time (each
/// read once the last is taken, so a page that does not read holds one piece, and one turn
/// of the daemon's thread reads at most one: see [`crate::daemon::event_log`]); `false` when
/// the peer is gone.
async fn replay_to(
    web: &Web,
    sink: &EventSink,
    id: &str,
    log: &mut crate::daemon::event_log::EventReader,
    next: &mut u64,
    upto: u64,
    large: bool,
) -> bool {
    while *next < upto {
        let piece = log.piece(*next, upto);
        let events = if large {
            super::feed::coalesce(piece.events)
        } else {
            piece.events
        };
        if !send_events(web, sink, id, &events, next).await {
            return false;
        }
        if piece.done {
            break;
        }
        tokio::task::yield_now().await;
    }
    true
}

/// Sends the events numbered `next` and later, as one frame; `false` when the peer is gone.
async fn send_events(
    web: &Web,
    sink: &EventSink,
    id: &str,
    events: &[crate::daemon::registry::Numbered],
    next: &mut u64,
) -> bool {
    let pieces = super::feed::pieces(&web.feeds.frames, id, events, *next);
    let Some(&(last, _)) = pieces.last() else {
        return true;
    };
    *next = last + 1;
    sink.send(super::feed::assemble(&pieces)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_has_a_handler_name_this_module_knows() {
        let handled = [
            "page",
            "script",
            "style",
            "runs",
            "runs_events",
            "run",
            "events",
            "memory",
            "log",
            "cancel",
            "metrics",
        ];
        for r in ROUTES {
            assert!(handled.contains(&r.name), "route {} has no handler", r.name);
        }
    }

    #[test]
    fn stage_segments_cannot_leave_the_stage_directory() {
        for bad in ["", "..", ".hidden", "a/b", "a\\b", "a\0"] {
            assert!(!safe_segment(bad), "{bad:?}");
        }
        assert!(safe_segment("train-1.b"));
    }

    #[test]
    fn a_log_tail_starts_at_a_line() {
        let dir = std::env::temp_dir().join(format!("web-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.log");
        std::fs::write(&path, "first line\nsecond\nthird\n").unwrap();
        assert_eq!(tail(&path, 12).unwrap(), b"third\n");
        assert_eq!(tail(&path, 1000).unwrap().len(), 24);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
