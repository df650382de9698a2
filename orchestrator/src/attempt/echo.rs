//! `--follow`: a stage's output shown on the console as it comes, line by line and prefixed
//! with the stage's name, while still going to its log files.
//!
//! Without `--follow` the stage writes straight into its log files and the orchestrator never
//! touches the bytes; with it, each stream goes through a pipe that a task copies to the log
//! file and the console.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
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

/// Longest piece of one line held for the console: a longer line is shown in pieces of this
/// size, so a stage writing megabytes without a newline costs no more memory than this.
pub const MAX_LINE: usize = 64 << 10;
/// `\r`-terminated updates (progress bars redrawing one line) are shown at most this often.
pub const CR_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Turns a stream of bytes into console lines: `\n` ends a line; `\r` ends an update of the
/// current line (shown, at most once per [`CR_EVERY`]); a line longer than [`MAX_LINE`] is
/// shown in pieces, each marked with a trailing `…`.
#[derive(Debug, Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
    last_cr: Option<std::time::Instant>,
}

impl LineSplitter {
    /// Feeds `bytes`; returns the lines to show now (without their terminators).
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for &b in bytes {
            match b {
                b'\n' => out.push(std::mem::take(&mut self.pending)),
                b'\r' => {
                    let due = self.last_cr.is_none_or(|t| t.elapsed() >= CR_EVERY);
                    if due && !self.pending.is_empty() {
                        self.last_cr = Some(std::time::Instant::now());
                        out.push(std::mem::take(&mut self.pending));
                    } else {
                        self.pending.clear();
                    }
                }
                _ => {
                    self.pending.push(b);
                    if self.pending.len() >= MAX_LINE {
                        let mut piece = std::mem::take(&mut self.pending);
                        piece.extend_from_slice(" …".as_bytes());
                        out.push(piece);
                    }
                }
            }
        }
        out
    }

    /// What is left at the end of the stream (a last line without a newline).
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        (!self.pending.is_empty()).then(|| std::mem::take(&mut self.pending))
    }
}

/// Sends the stream through a pipe; a task appends every byte to `log` as it comes and shows
/// each line on the console as `[stage] line` (see [`LineSplitter`]).
pub fn echoed(log: File, stage: &str, is_stderr: bool) -> std::io::Result<Stream> {
    use tokio::io::AsyncReadExt;
    let (reader, writer) = std::io::pipe()?;
    let mut receiver = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))?;
    let prefix = format!("[{stage}{}] ", if is_stderr { " stderr" } else { "" });
    let copier = tokio::task::spawn_local(async move {
        let mut log = log;
        let mut buf = vec![0u8; 16 << 10];
        let mut lines = LineSplitter::default();
        let show = |line: Vec<u8>| {
            let mut shown = prefix.clone().into_bytes();
            shown.extend_from_slice(&line);
            shown.push(b'\n');
            let _ = std::io::stderr().lock().write_all(&shown);
        };
        loop {
            match receiver.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let _ = log.write_all(&buf[..n]);
                    for line in lines.feed(&buf[..n]) {
                        show(line);
                    }
                }
            }
        }
        if let Some(rest) = lines.finish() {
            show(rest);
        }
    });
    Ok(Stream {
        stdio: OwnedFd::from(writer),
        copier: Some(copier),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newlines_carriage_returns_and_overlong_lines() {
        let mut s = LineSplitter::default();
        assert_eq!(s.feed(b"a\nb"), vec![b"a".to_vec()]);
        // The first \r update shows; the next within a second is dropped.
        assert_eq!(s.feed(b"\r10%\r20%\r"), vec![b"b".to_vec()]);
        assert_eq!(s.feed(b"30%\n"), vec![b"30%".to_vec()]);
        let long = vec![b'x'; MAX_LINE * 3 + 5];
        let pieces = s.feed(&long);
        assert_eq!(pieces.len(), 3);
        assert!(pieces.iter().all(|p| p.len() <= MAX_LINE + 4));
        assert!(s.pending.len() <= MAX_LINE, "bounded");
        assert_eq!(s.finish(), Some(vec![b'x'; 5]));
        assert_eq!(s.finish(), None);
    }
}
