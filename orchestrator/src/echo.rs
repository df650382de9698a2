//! `--follow`: a stage's output shown on the console as it comes, line by line and prefixed
//! with the stage's name, while still going to its log files.
//!
//! Without `--follow` the stage writes straight into its log files and the orchestrator never
//! touches the bytes; with it, each stream goes through a pipe that a task copies to the log
//! file and the console.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinHandle;

/// One stream of a stage: where the child writes, and the task that copies it (if echoing).
pub struct Stream {
    /// Give this to the child.
    pub stdio: OwnedFd,
    /// Ends once every process holding the stream's write end has closed it.
    pub copier: Option<JoinHandle<()>>,
}

/// Sends the stream straight to `log` (no echo).
pub fn direct(log: File) -> Stream {
    Stream {
        stdio: OwnedFd::from(log),
        copier: None,
    }
}

/// Sends the stream through a pipe; a task appends each line to `log` and prints it on the
/// console as `[stage] line`.
pub fn echoed(log: File, stage: &str, is_stderr: bool) -> std::io::Result<Stream> {
    let (reader, writer) = std::io::pipe()?;
    let receiver = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))?;
    let prefix = format!("[{stage}{}] ", if is_stderr { " stderr" } else { "" });
    let copier = tokio::task::spawn_local(async move {
        let mut log = log;
        let mut lines = BufReader::new(receiver);
        let mut line = Vec::new();
        loop {
            line.clear();
            match lines.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let _ = log.write_all(&line);
                    let mut shown = prefix.clone().into_bytes();
                    shown.extend_from_slice(&line);
                    if !shown.ends_with(b"\n") {
                        shown.push(b'\n');
                    }
                    let _ = std::io::stderr().lock().write_all(&shown);
                }
            }
        }
    });
    Ok(Stream {
        stdio: OwnedFd::from(writer),
        copier: Some(copier),
    })
}
