//! The routes' answers. Every request is checked by [`Auth::gate`](super::auth::Auth::gate)
//! before its route is looked at further; the route is found in [`ROUTES`] and its handler
//! chosen by the route's name.

use super::cadence::KEEPALIVE;
use super::http::{self, Request, Response};
use super::Web;
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

/// Serves one connection: one request, then close. The connection is admitted (out of the
/// budget of those without the token, see [`super::admission`]) once the gate passes it.
pub async fn serve(web: Rc<Web>, mut stream: TcpStream, mut ticket: super::admission::Ticket) {
    let request = match http::read_head(&mut stream).await {
        Ok(r) => r,
        Err(http::HeadError::Incomplete) => return,
        Err(e @ http::HeadError::TooLarge) => {
            let _ = http::write(
                &mut stream,
                &Response::text(431, e.to_string()).encode(false),
            )
            .await;
            return;
        }
        Err(e) => {
            let _ = http::write(
                &mut stream,
                &Response::text(400, e.to_string()).encode(false),
            )
            .await;
            return;
        }
    };
    let found = find(&request);
    let head_only = request.method == "HEAD";
    let answer = match web.auth.gate(&request, found.as_ref().map(|(r, _)| *r)) {
        Err(refused) => refused,
        Ok(_) if !ticket.admit() => Response::text(
            503,
            "busy: too many connections being served at once; try again",
        ),
        Ok(super::auth::Pass::SetCookie { location }) => Response::text(303, "see the page")
            .with("Set-Cookie", web.auth.set_cookie())
            .with("Location", location),
        Ok(super::auth::Pass::Serve) => match found {
            None => Response::text(404, format!("no such page: {}", request.path)),
            Some((route, params)) => {
                if route.name == "events" {
                    return events(&web, stream, &request, &params[0]).await;
                }
                if route.name == "runs_events" {
                    return super::runs_stream::serve(&web, stream).await;
                }
                answer(&web, route, &params, &request).await
            }
        },
    };
    let _ = http::write(&mut stream, &answer.encode(head_only)).await;
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
    let report = tokio::task::spawn_blocking(move || crate::report::load_for_display(&dir).ok())
        .await
        .ok()
        .flatten();
    Response::json(&serde_json::json!({ "info": info, "report": report }))
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
async fn events(web: &Rc<Web>, mut stream: TcpStream, request: &Request, id: &str) {
    let from = request
        .header("last-event-id")
        .and_then(|s| s.parse::<u64>().ok())
        .map(|n| n + 1)
        .or_else(|| request.param("from").and_then(|s| s.parse().ok()))
        .unwrap_or(0);
    {
        let registry = web.daemon.registry.borrow();
        web.frames
            .retain(|run| registry.get(run).is_some_and(|r| !r.finished()));
    }
    let Some(mut sub) = super::feed::subscribe(web, id) else {
        let _ = http::write(&mut stream, &not_found(id).encode(false)).await;
        return;
    };
    let mut head = http::head(200, "text/event-stream", &[]);
    head.extend_from_slice(b"\r\n");
    if !http::write(&mut stream, &head).await {
        return;
    }
    let mut next = from;
    let (upto, large) = (sub.upto, sub.large);
    if !replay_to(web, &mut stream, id, &mut sub.log, &mut next, upto, large).await {
        return;
    }
    if let Some(mut batches) = sub.batches {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match tokio::time::timeout(KEEPALIVE, batches.recv()).await {
                Err(_) => {
                    if !http::write(&mut stream, b": keepalive\n\n").await {
                        return;
                    }
                }
                Ok(Ok(batch)) => {
                    if let Some(bytes) = batch.after(next) {
                        next = batch.to + 1;
                        if !http::write(&mut stream, &bytes).await {
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
                    if !replay_to(web, &mut stream, id, &mut sub.log, &mut next, count, large).await
                    {
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
    web.frames.forget(id);
    let info = web.daemon.registry.borrow().get(id).map(|r| r.info());
    let data = serde_json::to_string(&info).unwrap_or_default();
    let _ = http::write(&mut stream, &sse("end", None, &data)).await;
}

/// Writes run `id`'s events from `*next` up to `upto` from its log, a piece at a time (each
/// read once the last is written, so a page that does not read holds one piece, and one turn
/// of the daemon's thread reads at most one: see [`crate::daemon::event_log`]); `false` when
/// the peer is gone.
async fn replay_to(
    web: &Web,
    stream: &mut TcpStream,
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
        if !send_events(web, stream, id, &events, next).await {
            return false;
        }
        if piece.done {
            break;
        }
        tokio::task::yield_now().await;
    }
    true
}

/// Writes the events numbered `next` and later, in one write; `false` when the peer is gone.
async fn send_events(
    web: &Web,
    stream: &mut TcpStream,
    id: &str,
    events: &[crate::daemon::registry::Numbered],
    next: &mut u64,
) -> bool {
    let pieces = super::feed::pieces(web, id, events, *next);
    let Some(&(last, _)) = pieces.last() else {
        return true;
    };
    *next = last + 1;
    http::write(stream, &super::feed::assemble(&pieces)).await
}

/// Event `seq`'s `data:` frame (its `id:` line, where it has one, is added before it).
fn piece(seq: u64, event: &protocol::daemon::RunEvent) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(b"data: {\"seq\":");
    out.extend_from_slice(seq.to_string().as_bytes());
    out.extend_from_slice(b",\"event\":");
    if serde_json::to_writer(&mut out, event).is_err() {
        out.extend_from_slice(b"null");
    }
    out.extend_from_slice(b"}\n\n");
    out
}

/// One run's latest frames, by sequence number, oldest first.
type Ring = std::collections::VecDeque<(u64, Rc<[u8]>)>;

/// The server-sent-event frames (`data:` lines) of each run's latest events, encoded once for
/// all the pages that stream them: at most [`Frames::KEPT`] per run, and only for runs not finished.
#[derive(Default)]
pub struct Frames {
    runs: std::cell::RefCell<std::collections::HashMap<String, Ring>>,
}

impl Frames {
    /// Frames kept per run.
    pub const KEPT: usize = 4096;

    /// The `data:` frame of run `id`'s event `seq`, encoded now unless its feed or a page's
    /// stream just did.
    pub fn get(&self, id: &str, seq: u64, event: &protocol::daemon::RunEvent) -> Rc<[u8]> {
        let mut runs = self.runs.borrow_mut();
        // Looked up before inserting: a page's stream asks once per event, and a key made
        // for every lookup was an allocation each.
        if !runs.contains_key(id) {
            runs.insert(id.to_string(), Ring::default());
        }
        let Some(ring) = runs.get_mut(id) else {
            return Rc::from(Vec::new());
        };
        if let Some(&(first, _)) = ring.front() {
            if let Some((_, frame)) = seq.checked_sub(first).and_then(|i| ring.get(i as usize)) {
                return frame.clone();
            }
        }
        let frame: Rc<[u8]> = piece(seq, event).into();
        // Kept only when it extends the ring (the live edge), so the ring stays in order.
        let extends = ring.back().is_none_or(|&(last, _)| seq == last + 1);
        if extends {
            if ring.len() == Self::KEPT {
                ring.pop_front();
            }
            ring.push_back((seq, frame.clone()));
        } else if ring.back().is_some_and(|&(last, _)| seq > last + 1) {
            ring.clear();
            ring.push_back((seq, frame.clone()));
        }
        frame
    }

    /// Run `id` has ended: its frames go.
    pub fn forget(&self, id: &str) {
        self.runs.borrow_mut().remove(id);
    }

    /// Keeps the frames of the runs `live` says yes to (the others have ended).
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.runs.borrow_mut().retain(|id, _| live(id));
    }
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
    fn a_frame_is_encoded_once_and_the_same_for_every_stream() {
        let frames = Frames::default();
        let event = |text: &str| protocol::daemon::RunEvent {
            t_ms: 7,
            kind: protocol::daemon::RunEventKind::Note { text: text.into() },
        };
        let a = frames.get("r", 5, &event("five"));
        let again = frames.get("r", 5, &event("five"));
        assert!(
            Rc::ptr_eq(&a, &again),
            "the second stream reuses the first's frame"
        );
        let text = String::from_utf8(a.to_vec()).unwrap();
        let data = text.lines().next().unwrap().strip_prefix("data: ").unwrap();
        assert!(
            text.starts_with("data: ") && text.ends_with("}\n\n"),
            "{text}"
        );
        let data: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(data["seq"], 5);
        assert_eq!(data["event"]["text"], "five");
        // An older event than the ring holds is encoded, not kept; a jump restarts the ring.
        frames.get("r", 6, &event("six"));
        let one = frames.get("r", 1, &event("one"));
        assert!(!Rc::ptr_eq(&one, &frames.get("r", 1, &event("one"))));
        let far = frames.get("r", 100, &event("hundred"));
        assert!(Rc::ptr_eq(&far, &frames.get("r", 100, &event("hundred"))));
        frames.retain(|_| false);
        let after = frames.get("r", 100, &event("hundred"));
        assert!(!Rc::ptr_eq(&far, &after), "a finished run's frames go");
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
