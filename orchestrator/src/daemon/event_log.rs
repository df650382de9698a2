//! A run's event log (`<run>/events.jsonl`, one event per line, line `n` the event numbered
//! `n`) read back in bounded pieces, for watchers that replay it (`watch --from`, the web
//! view's event streams).
//!
//! Promises: one [`EventReader::piece`] reads at most [`PIECE_BYTES`] of the file and parses
//! only the lines it returns, so no turn of the daemon's thread does work that grows with the
//! log; a reader holds one piece, the rest of one line and the events of one piece, so a
//! watcher that does not read costs the daemon a bounded amount (its caller reads the next
//! piece only once the last one is written); a reader holds the file open and nothing else,
//! and gives everything back when dropped. A line longer than [`MAX_LINE`] is skipped, as is
//! one that does not parse (its number is skipped with it).
//!
//! The daemon writes each event whole and flushes it before it tells watchers of it, on the
//! same thread that reads here, so a reader never sees half an event.

use protocol::daemon::RunEvent;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An event with its sequence number.
pub type Numbered = (u64, std::sync::Arc<RunEvent>);

/// Most bytes of the log read at a time.
pub const PIECE_BYTES: usize = 64 << 10;
/// Longest event line read back; a longer one is skipped.
pub const MAX_LINE: usize = 4 << 20;

/// Reads a run's event log forward, one piece at a time.
pub struct EventReader {
    path: PathBuf,
    /// Opened at the first piece; `None` after it could not be.
    file: Option<File>,
    opened: bool,
    /// The number of the next line to finish.
    line: u64,
    /// Where in the file the next read starts.
    offset: u64,
    /// The start of that line, read but not ended yet (empty while skipping).
    partial: Vec<u8>,
    /// The line being read is longer than [`MAX_LINE`]: skipped to its end.
    skipping: bool,
}

/// What one [`EventReader::piece`] gave.
pub struct Piece {
    /// The events read, numbered, in order.
    pub events: Vec<Numbered>,
    /// Nothing is left to read below the limit asked for (or the file ended).
    pub done: bool,
}

impl EventReader {
    /// A reader of the log at `path`, from its first line.
    pub fn new(path: &Path) -> EventReader {
        EventReader {
            path: path.to_path_buf(),
            file: None,
            opened: false,
            line: 0,
            offset: 0,
            partial: Vec::new(),
            skipping: false,
        }
    }

    /// Reads the next piece (at most [`PIECE_BYTES`]): the events it ends that are numbered
    /// from `from` up to, not including, `upto`. Lines before `from` are counted, not parsed;
    /// the reader stops at line `upto`, so a later call with a higher limit reads on from
    /// there.
    pub fn piece(&mut self, from: u64, upto: u64) -> Piece {
        let mut events = Vec::new();
        if self.line >= upto {
            return Piece { events, done: true };
        }
        if !self.opened {
            self.opened = true;
            self.file = File::open(&self.path).ok();
        }
        let Some(file) = self.file.as_ref() else {
            return Piece { events, done: true };
        };
        let mut buf = vec![0u8; PIECE_BYTES];
        let n = match file.read_at(&mut buf, self.offset) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                return Piece {
                    events,
                    done: false,
                }
            }
            Err(_) => 0,
        };
        if n == 0 {
            return Piece { events, done: true };
        }
        let mut at = 0;
        while let Some(end) = buf[at..n].iter().position(|&b| b == b'\n') {
            let head = &buf[at..at + end];
            at += end + 1;
            let seq = self.line;
            self.line += 1;
            let too_long = self.partial.len() + head.len() > MAX_LINE;
            if !std::mem::take(&mut self.skipping) && !too_long && seq >= from {
                let line: &[u8] = if self.partial.is_empty() {
                    head
                } else {
                    self.partial.extend_from_slice(head);
                    &self.partial
                };
                if let Ok(event) = serde_json::from_slice::<RunEvent>(line) {
                    events.push((seq, Arc::new(event)));
                }
            }
            self.partial = Vec::new();
            if self.line >= upto {
                // The next line is read by a later call, from its start.
                self.offset += at as u64;
                return Piece { events, done: true };
            }
        }
        self.keep_partial(&buf[at..n]);
        self.offset += n as u64;
        Piece {
            events,
            done: false,
        }
    }

    /// Keeps the start of an unfinished line, unless it is too long to read back.
    fn keep_partial(&mut self, rest: &[u8]) {
        if self.skipping || rest.is_empty() {
            return;
        }
        if self.partial.len() + rest.len() > MAX_LINE {
            self.partial = Vec::new();
            self.skipping = true;
        } else {
            self.partial.extend_from_slice(rest);
        }
    }
}

/// The number of events in the log at `path` (its lines), counted a piece at a time.
pub fn count_lines(path: &Path) -> u64 {
    let Ok(mut file) = File::open(path) else {
        return 0;
    };
    let mut buf = vec![0u8; PIECE_BYTES];
    let mut lines = 0u64;
    loop {
        match file.read(&mut buf) {
            Ok(0) => return lines,
            Ok(n) => lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return lines,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::daemon::RunEventKind;

    fn note(i: usize, len: usize) -> String {
        let event = RunEvent {
            t_ms: i as u64,
            kind: RunEventKind::Note {
                text: "x".repeat(len),
            },
        };
        serde_json::to_string(&event).unwrap()
    }

    #[test]
    fn pieces_are_bounded_and_together_are_the_log_from_where_asked() {
        let dir = crate::testutil::scratch("event-log");
        let path = dir.path().join("events.jsonl");
        let mut text = String::new();
        for i in 0..3000 {
            text.push_str(&note(i, 40));
            text.push('\n');
        }
        // A line too long to read back, and one that does not parse: both skipped.
        text.push_str(&note(3000, MAX_LINE + 10));
        text.push_str("\nnot json\n");
        text.push_str(&note(3002, 1));
        text.push('\n');
        std::fs::write(&path, &text).unwrap();
        assert_eq!(count_lines(&path), 3003);

        let mut reader = EventReader::new(&path);
        let mut seqs = Vec::new();
        let mut pieces = 0;
        loop {
            let piece = reader.piece(1000, 3003);
            pieces += 1;
            assert!(piece.events.len() * 40 <= PIECE_BYTES, "one piece's worth");
            seqs.extend(piece.events.iter().map(|(s, _)| *s));
            if piece.done {
                break;
            }
        }
        let want: Vec<u64> = (1000..3000).chain([3002]).collect();
        assert!(
            seqs == want,
            "{} events from {:?} to {:?}",
            seqs.len(),
            seqs.first(),
            seqs.last()
        );
        assert!(pieces > text.len() / PIECE_BYTES, "{pieces} pieces");
        assert!(reader.partial.capacity() <= MAX_LINE + PIECE_BYTES);
        // Nothing past the limit asked for, and a later call with a higher one goes on there.
        let mut reader = EventReader::new(&path);
        let piece = reader.piece(0, 10);
        assert!(piece.done);
        let seqs: Vec<u64> = piece.events.iter().map(|e| e.0).collect();
        assert_eq!(seqs, (0..10).collect::<Vec<_>>());
        let piece = reader.piece(10, 12);
        let seqs: Vec<u64> = piece.events.iter().map(|e| e.0).collect();
        assert_eq!(seqs, vec![10, 11]);
    }
}
