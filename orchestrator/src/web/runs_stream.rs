//! The runs list, live: `GET /api/events` streams, as server-sent events, every run's
//! `{info, gpus}` at once (`event: runs` with `"all": true`), then, at most every
//! [`BATCH`], the runs that changed since (a run submitted, one that moved: every change of
//! a run's counts or state is one of its events). A page keeps the list by run id.
//!
//! Each stream looks at the daemon's registry in memory (a run's state and event count, no
//! copy) every [`BATCH`] and writes only when something changed, so an idle daemon's open
//! lists cost no writes but a keepalive.

use super::cadence::{BATCH, KEEPALIVE};
use super::http::{self, EventSink, Response};
use super::state::Web;
use protocol::status::RunStatus;
use std::collections::HashMap;
use std::rc::Rc;

/// What says a run changed: its state and its number of events.
type Seen = HashMap<String, (RunStatus, u64)>;

/// The runs whose state or event count differ from `seen`'s, as one `event: runs` frame
/// (`all`: every run, sent even when there is none); `seen` updated. `None` when none changed.
fn changes(web: &Web, seen: &mut Seen, all: bool) -> Option<Vec<u8>> {
    let registry = web.daemon.registry.borrow();
    let tally = web.daemon.tally.borrow();
    let mut runs = Vec::new();
    for run in registry.all() {
        let now = (run.state, run.event_count());
        let id = &run.submission.id;
        if seen.get(id) == Some(&now) {
            continue;
        }
        seen.insert(id.clone(), now);
        let info = run.info();
        let gpus = tally.gpus_of(&info.id);
        runs.push(serde_json::json!({ "info": info, "gpus": gpus }));
    }
    if runs.is_empty() && !all {
        return None;
    }
    let data = serde_json::json!({
        "all": all,
        "runs": runs,
        "now_unix": crate::timefmt::unix_secs_f64(),
    });
    Some(format!("event: runs\ndata: {data}\n\n").into_bytes())
}

/// The answer of one page's live runs list: an event stream that lasts until the page goes.
pub fn serve(web: &Rc<Web>) -> Response {
    let (sink, answer) = http::event_stream();
    tokio::task::spawn_local(stream(web.clone(), sink));
    answer
}

/// How often a runs list looks at the machine's GPUs.
pub const MACHINE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The machine's GPUs as an `event: machine` frame, when they differ from `last` (updated).
fn machine_change(web: &Web, last: &mut String) -> Option<Vec<u8>> {
    let data = super::memory::machine(&web.memory, &web.daemon.host).to_string();
    if *last == data {
        return None;
    }
    let frame = format!("event: machine\ndata: {data}\n\n").into_bytes();
    *last = data;
    Some(frame)
}

async fn stream(web: Rc<Web>, sink: EventSink) {
    let mut seen = Seen::new();
    let mut machine = String::new();
    let mut first = changes(&web, &mut seen, true).unwrap_or_default();
    first.extend(machine_change(&web, &mut machine).unwrap_or_default());
    if !sink.send(first).await {
        return;
    }
    let mut quiet = std::time::Duration::ZERO;
    let mut since_machine = std::time::Duration::ZERO;
    loop {
        tokio::time::sleep(BATCH).await;
        since_machine += BATCH;
        let gpus = if since_machine >= MACHINE_EVERY {
            since_machine = std::time::Duration::ZERO;
            machine_change(&web, &mut machine)
        } else {
            None
        };
        let mut frame = changes(&web, &mut seen, false).unwrap_or_default();
        frame.extend(gpus.unwrap_or_default());
        if frame.is_empty() {
            if quiet + BATCH < KEEPALIVE {
                quiet += BATCH;
                continue;
            }
            frame = b": keepalive\n\n".to_vec();
        }
        quiet = std::time::Duration::ZERO;
        if !sink.send(frame).await {
            return;
        }
    }
}
