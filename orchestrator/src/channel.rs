//! The event channel of one stage attempt: a Unix stream socket that any process of the
//! stage's tree may connect to (several at once) and write JSON lines on.
//!
//! Promises: a line longer than [`MAX_LINE`] bytes, invalid UTF-8, malformed JSON, an unknown
//! event or an unknown protocol version is reported as a [`ChannelItem::Violation`] and
//! skipped; it never stops the orchestrator or the other connections. Every valid event is
//! appended, timestamped, to the stage's `events.jsonl`.

use protocol::worker::{WorkerEvent, WorkerMessage};
use std::cell::Cell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
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

/// Socket files to remove, by whoever holds the list (see [`EventChannel::remove_later`]).
pub type Discards = std::sync::Arc<std::sync::Mutex<Vec<PathBuf>>>;

/// A bound channel. Dropping it stops accepting and removes the socket file (or hands it to
/// the [`Discards`] list given to [`EventChannel::remove_later`]).
pub struct EventChannel {
    path: PathBuf,
    accept_task: tokio::task::JoinHandle<()>,
    open_connections: Rc<Cell<usize>>,
    listener_fd: std::os::fd::RawFd,
    discards: Option<Discards>,
}

impl EventChannel {
    /// Binds a socket at `path` (removing a stale one) and forwards what arrives to `tx`,
    /// recording valid events in `record_to`.
    pub fn bind(
        path: &Path,
        record_to: PathBuf,
        tx: mpsc::UnboundedSender<ChannelItem>,
    ) -> std::io::Result<EventChannel> {
        Self::listen(bind_socket(path)?, path, record_to, tx)
    }

    /// [`EventChannel::bind`] on a socket already bound at `path` (by [`bind_socket`]).
    pub fn listen(
        socket: std::os::unix::net::UnixListener,
        path: &Path,
        record_to: PathBuf,
        tx: mpsc::UnboundedSender<ChannelItem>,
    ) -> std::io::Result<EventChannel> {
        let listener = UnixListener::from_std(socket)?;
        let listener_fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        let open_connections = Rc::new(Cell::new(0usize));
        let open = open_connections.clone();
        let accept_task = tokio::task::spawn_local(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let tx = tx.clone();
                let record_to = record_to.clone();
                let open = open.clone();
                open.set(open.get() + 1);
                tokio::task::spawn_local(async move {
                    read_connection(stream, tx, record_to).await;
                    open.set(open.get() - 1);
                });
            }
        });
        Ok(EventChannel {
            path: path.to_path_buf(),
            accept_task,
            open_connections,
            listener_fd,
            discards: None,
        })
    }

    /// On drop, the socket file goes to `discards` instead of being removed there and then:
    /// a closed listener's file refuses connections, so its removal can wait for a thread
    /// that removes such files in batches, off the scheduling thread. The path must be unique
    /// to this channel (never bound again while it waits).
    pub fn remove_later(&mut self, discards: Discards) {
        self.discards = Some(discards);
    }

    /// Waits (at most `limit`) until every connection has been read to its end. Once the
    /// stage's processes are all gone their sockets are closed, so this returns as soon as
    /// the last bytes they wrote have been delivered.
    pub async fn drained(&self, limit: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while (self.open_connections.get() > 0 || self.connection_pending())
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Whether a connection waits in the listen queue, not yet accepted.
    fn connection_pending(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.listener_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout; the listener outlives this call (the accept
        // task that owns it is aborted only in drop).
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0 && pfd.revents & libc::POLLIN != 0
    }

    /// The socket path, for `ORCHESTRATE_EVENTS`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        self.accept_task.abort();
        match &self.discards {
            Some(list) => list
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(std::mem::take(&mut self.path)),
            None => {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
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
