//! The event channel of one stage attempt: a Unix stream socket that any process of the
//! stage's tree may connect to (several at once) and write JSON lines on.
//!
//! Promises: a line longer than [`MAX_LINE`] bytes, invalid UTF-8, malformed JSON, an unknown
//! event or an unknown protocol version is reported as a [`ChannelItem::Violation`] and
//! skipped; it never stops the orchestrator or the other connections. Every valid event is
//! appended, timestamped, to the stage's `events.jsonl`.

use crate::process::discard::{Discarded, Discards};
use protocol::worker::{WorkerEvent, WorkerMessage};
use std::cell::Cell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::task::{Context, Poll};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

/// Longest accepted line, in bytes.
pub const MAX_LINE: usize = 1 << 20;

/// What arrived on the channel.
#[derive(Debug, Clone, PartialEq)]
pub enum ChannelItem {
    /// A well-formed event.
    Event(WorkerEvent),
    /// Something that is not a valid message, described for the user.
    Violation(String),
}

/// A bound channel. Its connections are accepted while [`EventChannel::next`] or
/// [`EventChannel::drained`] is polled (no task of its own: a sweep opens one per stage), and
/// each connection is read by a task of its own. Dropping it stops accepting and removes the
/// socket file (or hands both to the [`Discards`] list given to
/// [`EventChannel::remove_later`]).
pub struct EventChannel {
    path: PathBuf,
    listener: Option<UnixListener>,
    /// False once accepting failed: the channel takes no more connections.
    accepting: bool,
    record_to: PathBuf,
    /// What the connections' tasks send; made at the first connection (most stages of a
    /// sweep never connect).
    items: Option<(
        mpsc::UnboundedSender<ChannelItem>,
        mpsc::UnboundedReceiver<ChannelItem>,
    )>,
    open_connections: Rc<Cell<usize>>,
    discards: Option<Discards>,
}

impl EventChannel {
    /// Binds a socket at `path` (removing a stale one); valid events that arrive are recorded
    /// in `record_to`.
    pub fn bind(path: &Path, record_to: PathBuf) -> std::io::Result<EventChannel> {
        Self::listen(register(bind_socket(path)?)?, path, record_to)
    }

    /// [`EventChannel::bind`] on a listener already bound at `path` (by [`bind_socket`]) and
    /// registered with the runtime (by [`register`]).
    pub fn listen(
        listener: UnixListener,
        path: &Path,
        record_to: PathBuf,
    ) -> std::io::Result<EventChannel> {
        Ok(EventChannel {
            path: path.to_path_buf(),
            listener: Some(listener),
            accepting: true,
            record_to,
            items: None,
            open_connections: Rc::new(Cell::new(0)),
            discards: None,
        })
    }

    /// On drop, the socket file and its listener go to `discards` instead of being closed
    /// and removed there and then, by a thread that does so in batches, off the scheduling
    /// thread. The path must be unique to this channel (never bound again while it waits).
    pub fn remove_later(&mut self, discards: Discards) {
        self.discards = Some(discards);
    }

    /// The next item any connection sent; accepts connections meanwhile. Cancel-safe.
    pub async fn next(&mut self) -> ChannelItem {
        std::future::poll_fn(|cx| {
            self.accept_ready(cx);
            match &mut self.items {
                Some((_, rx)) => match rx.poll_recv(cx) {
                    Poll::Ready(Some(item)) => Poll::Ready(item),
                    _ => Poll::Pending,
                },
                None => Poll::Pending,
            }
        })
        .await
    }

    /// An item already received, if any.
    pub fn try_next(&mut self) -> Option<ChannelItem> {
        self.items.as_mut()?.1.try_recv().ok()
    }

    /// Accepts every connection the runtime saw arrive, starting a reading task for each.
    fn accept_ready(&mut self, cx: &mut Context<'_>) {
        let Some(listener) = self.listener.as_ref().filter(|_| self.accepting) else {
            return;
        };
        loop {
            match listener.poll_accept(cx) {
                Poll::Ready(Ok((stream, _))) => {
                    let tx = self
                        .items
                        .get_or_insert_with(mpsc::unbounded_channel)
                        .0
                        .clone();
                    let record_to = self.record_to.clone();
                    let open = self.open_connections.clone();
                    open.set(open.get() + 1);
                    tokio::task::spawn_local(async move {
                        read_connection(stream, tx, record_to).await;
                        open.set(open.get() - 1);
                    });
                }
                Poll::Ready(Err(_)) => {
                    self.accepting = false;
                    return;
                }
                Poll::Pending => return,
            }
        }
    }

    /// Waits (at most `limit`) until every connection, the ones still waiting to be accepted
    /// included, has been read to its end. Once the stage's processes are all gone their
    /// sockets are closed, so this returns as soon as the last bytes they wrote have been
    /// delivered.
    pub async fn drained(&mut self, limit: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            std::future::poll_fn(|cx| {
                self.accept_ready(cx);
                Poll::Ready(())
            })
            .await;
            let waiting = self.accepting && self.connection_pending();
            if (self.open_connections.get() == 0 && !waiting)
                || tokio::time::Instant::now() >= deadline
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Whether a connection waits in the listen queue, not yet accepted.
    fn connection_pending(&self) -> bool {
        let Some(listener) = &self.listener else {
            return false;
        };
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(listener),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd of a listener this channel owns, zero timeout.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0 && pfd.revents & libc::POLLIN != 0
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        let discarded = Discarded::Socket {
            path: std::mem::take(&mut self.path),
            listener: self.listener.take(),
        };
        match &self.discards {
            Some(list) => list
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(discarded),
            None => discarded.remove(),
        }
    }
}

/// Registers `socket` (from [`bind_socket`]) with the runtime whose context the calling
/// thread is in; a thread outside the runtime may do it inside [`tokio::runtime::Handle::enter`].
pub fn register(socket: std::os::unix::net::UnixListener) -> std::io::Result<UnixListener> {
    UnixListener::from_std(socket)
}

/// A listening, non-blocking Unix socket at `path` (a stale file there is replaced), for
/// [`EventChannel::listen`]; any thread may make one.
pub fn bind_socket(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    let socket = match std::os::unix::net::UnixListener::bind(path) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            let _ = std::fs::remove_file(path);
            std::os::unix::net::UnixListener::bind(path)?
        }
        other => other?,
    };
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// What was wrong with a line a stage sent on its event channel (a protocol violation).
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    /// The bytes are not UTF-8.
    #[error("a line that is not UTF-8")]
    NotUtf8(#[source] std::str::Utf8Error),
    /// The text is not JSON.
    #[error("a line that is not JSON ({0})")]
    NotJson(#[source] serde_json::Error),
    /// The message speaks another protocol version.
    #[error(
        "a message of protocol version {found}; this orchestrate speaks version {}: use matching versions of the worker and orchestrate",
        protocol::PROTOCOL_VERSION
    )]
    Version {
        /// The version the message carries.
        found: u64,
    },
    /// The message has no `v` field.
    #[error("a message without a \"v\" (protocol version) field")]
    NoVersion,
    /// The message is JSON of the right version but no event the protocol knows.
    #[error("an invalid message ({0})")]
    Invalid(#[source] serde_json::Error),
    /// The line is longer than the channel takes; it was dropped.
    #[error("a line longer than {max} bytes (dropped)")]
    TooLong {
        /// The longest line taken, in bytes.
        max: usize,
    },
}

/// Parses one line; the error says what was wrong with it.
pub fn parse_line(line: &[u8]) -> Result<WorkerEvent, LineError> {
    let text = std::str::from_utf8(line).map_err(LineError::NotUtf8)?;
    let value: serde_json::Value = serde_json::from_str(text).map_err(LineError::NotJson)?;
    match value.get("v").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(protocol::PROTOCOL_VERSION) => {}
        Some(found) => return Err(LineError::Version { found }),
        None => return Err(LineError::NoVersion),
    }
    serde_json::from_value::<WorkerMessage>(value)
        .map(|m| m.event)
        .map_err(LineError::Invalid)
}

async fn read_connection(
    stream: UnixStream,
    tx: mpsc::UnboundedSender<ChannelItem>,
    record_to: PathBuf,
) {
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let mut line: Vec<u8> = Vec::new();
    let mut oversized = false;
    loop {
        let buf = match reader.fill_buf().await {
            Ok(buf) => buf,
            Err(_) => return,
        };
        if buf.is_empty() {
            if !line.is_empty() && !oversized {
                deliver(&line, &tx, &record_to);
            }
            return;
        }
        let (chunk, found_newline) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..i], true),
            None => (buf, false),
        };
        if !oversized {
            if line.len() + chunk.len() > MAX_LINE {
                oversized = true;
                line.clear();
                let why = LineError::TooLong { max: MAX_LINE };
                let _ = tx.send(ChannelItem::Violation(why.to_string()));
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let consumed = chunk.len() + usize::from(found_newline);
        reader.consume(consumed);
        if found_newline {
            if !oversized && !line.iter().all(u8::is_ascii_whitespace) {
                deliver(&line, &tx, &record_to);
            }
            line.clear();
            oversized = false;
        }
    }
}

fn deliver(line: &[u8], tx: &mpsc::UnboundedSender<ChannelItem>, record_to: &Path) {
    match parse_line(line) {
        Ok(event) => {
            if let Ok(mut file) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(record_to)
            {
                let stamped = serde_json::json!({
                    "t": crate::timefmt::unix_ms(),
                    "v": protocol::PROTOCOL_VERSION,
                    "event": &event,
                });
                let _ = writeln!(file, "{stamped}");
            }
            let _ = tx.send(ChannelItem::Event(event));
        }
        Err(why) => {
            let _ = tx.send(ChannelItem::Violation(why.to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_valid_and_names_what_is_wrong() {
        let ok = parse_line(br#"{"v":1,"event":"progress","step":3,"loss":1.5}"#).unwrap();
        assert_eq!(
            ok,
            WorkerEvent::Progress {
                step: 3,
                total_steps: None,
                loss: Some(1.5),
                tokens_per_s: None
            }
        );
        let err = |line: &[u8]| parse_line(line).unwrap_err();
        assert!(matches!(err(b"\xff\xfe"), LineError::NotUtf8(_)));
        assert_eq!(err(b"\xff\xfe").to_string(), "a line that is not UTF-8");
        assert!(matches!(err(b"{nope"), LineError::NotJson(_)));
        assert!(err(b"{nope")
            .to_string()
            .starts_with("a line that is not JSON ("));
        assert!(matches!(
            err(br#"{"v":9,"event":"done"}"#),
            LineError::Version { found: 9 }
        ));
        assert_eq!(
            err(br#"{"v":9,"event":"done"}"#).to_string(),
            format!(
                "a message of protocol version 9; this orchestrate speaks version {}: use matching versions of the worker and orchestrate",
                protocol::PROTOCOL_VERSION
            )
        );
        assert_eq!(
            err(br#"{"event":"done"}"#).to_string(),
            "a message without a \"v\" (protocol version) field"
        );
        assert!(matches!(
            err(br#"{"v":1,"event":"teleport"}"#),
            LineError::Invalid(_)
        ));
        assert!(err(br#"{"v":1,"event":"teleport"}"#)
            .to_string()
            .starts_with("an invalid message ("));
        assert_eq!(
            LineError::TooLong { max: MAX_LINE }.to_string(),
            format!("a line longer than {MAX_LINE} bytes (dropped)")
        );
    }
}
