//! A blocking client of `orchestrate daemon`, for Rust programs and the CLI's client
//! commands (`submit`, `runs`, `watch`, `wait`, `cancel`, `shutdown`).

use protocol::daemon::{Request, Response, RunEvent, RunEventKind, DAEMON_PROTOCOL_VERSION};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Why talking to the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens there.
    #[error(
        "no daemon at {path}: {source} (start one with `orchestrate daemon`, or give --socket)"
    )]
    Connect {
        /// The socket.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The connection broke.
    #[error("the connection to the daemon broke: {0}")]
    Io(#[from] std::io::Error),
    /// The daemon refused the connection (another user, too many connections).
    #[error("the daemon refused the connection: {0}")]
    Refused(String),
    /// The daemon said something that is not an answer.
    #[error("the daemon sent something that is not an answer: {0}")]
    Protocol(String),
}

/// A connection to the daemon.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// The daemon's greeting.
    pub hello: Response,
}

impl Client {
    /// Connects and reads the greeting.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let writer = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.display().to_string(),
            source,
        })?;
        let mut reader = BufReader::new(writer.try_clone()?);
        let hello = read(&mut reader)?;
        if let Response::Error { error, .. } = &hello {
            return Err(ClientError::Refused(error.clone()));
        }
        Ok(Client {
            reader,
            writer,
            hello,
        })
    }

    /// Sends one request.
    pub fn send(&mut self, request: &Request) -> Result<(), ClientError> {
        let mut line =
            serde_json::to_vec(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
        line.push(b'\n');
        self.writer.write_all(&line)?;
        Ok(())
    }

    /// Reads the next answer.
    pub fn receive(&mut self) -> Result<Response, ClientError> {
        read(&mut self.reader)
    }

    /// Sends a request and reads its (single) answer.
    pub fn call(&mut self, request: &Request) -> Result<Response, ClientError> {
        self.send(request)?;
        self.receive()
    }
}

fn read(reader: &mut BufReader<UnixStream>) -> Result<Response, ClientError> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(ClientError::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the daemon closed the connection",
        )));
    }
    serde_json::from_str(&line).map_err(|e| ClientError::Protocol(format!("{e}: {line}")))
}

/// The version every request of this client carries.
pub const V: u32 = DAEMON_PROTOCOL_VERSION;

/// One event as a console line.
pub fn render_event(event: &RunEvent) -> String {
    let time = crate::timefmt::rfc3339_ms(event.t_ms);
    let text = match &event.kind {
        RunEventKind::Note { text } => text.clone(),
        RunEventKind::Warning { text } => format!("warning: {text}"),
        RunEventKind::StageStarted {
            stage,
            attempt,
            pid,
            placement,
        } => format!("{stage}: started (attempt {attempt}), pid {pid}, on {placement}"),
        RunEventKind::Progress {
            stage,
            step,
            total,
            loss,
            ..
        } => {
            let mut t = format!("{stage}: step {step}");
            if let Some(total) = total {
                t.push_str(&format!("/{total}"));
            }
            if let Some(loss) = loss {
                t.push_str(&format!("  loss {loss:.4}"));
            }
            t
        }
        RunEventKind::StageWaiting { stage, reason } => format!("{stage}: {reason}"),
        RunEventKind::StageFinished {
            stage,
            status,
            detail,
            wall_s,
        } => {
            // As the console of a run started from the command line says it.
            let wall = crate::timefmt::human_wall(
                std::time::Duration::try_from_secs_f64(*wall_s).unwrap_or_default(),
            );
            if detail.is_empty() {
                format!("{stage}: {status} in {wall}")
            } else {
                format!("{stage}: {status} in {wall}: {detail}")
            }
        }
        RunEventKind::Text { text } => return text.clone(),
        RunEventKind::RunFinished { status, exit_code } => {
            format!("run {} (exit status {exit_code})", status.label())
        }
        RunEventKind::StageSkipped { stage, reason, .. } => format!("{stage}: skipped: {reason}"),
        // The stage's end said it will be retried; a newer daemon's events are skipped.
        RunEventKind::StageRetrying { .. }
        | RunEventKind::StageGpu { .. }
        | RunEventKind::Unknown => return String::new(),
        kind => match crate::report::console::warning_of(kind) {
            Some(text) => format!("warning: {text}"),
            None => return String::new(),
        },
    };
    format!("[{time}] {text}\n")
}
