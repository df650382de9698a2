//! The events of a placed stage instance ([`super::placement`]), carried from its node to the
//! batch node over the job step's own standard output, so that no network is needed between
//! them: the event socket of a run is a Unix socket, which a process on another host cannot
//! reach.
//!
//! On the node, the per-task wrapper listens on a socket of its own in a private directory
//! and hands its path to the command as `ORCHESTRATE_EVENTS`; every line a process of the
//! instance writes there comes out of the wrapper's stdout as one line starting with
//! [`PREFIX`], written whole. On the batch node, the launcher reads srun's stdout: such lines
//! go to the run's event socket, every other line to the stage's stdout log as it was.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What starts a relayed event line on the step's stdout (an ASCII record separator, then a
/// name no program prints by chance).
pub const PREFIX: &[u8] = b"\x1eorchestrate-event ";

/// How the private directory of a node's end is named, before its process id.
const DIR_PREFIX: &str = "orchestrate-step-";

/// The node's end: a socket whose lines are written to stdout with [`PREFIX`].
pub(crate) struct NodeEnd {
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    readers: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl NodeEnd {
    /// Listens on a new socket in a private directory under the node's temporary directory;
    /// returns it and the socket's path. Directories there left by wrappers that were killed
    /// before [`NodeEnd::finish`] (a step cancelled or preempted) are removed first.
    pub(crate) fn listen() -> std::io::Result<(NodeEnd, PathBuf)> {
        let base = std::env::temp_dir();
        crate::process::pid_dirs::remove_orphaned(&base, DIR_PREFIX);
        let dir = base.join(format!(
            "{DIR_PREFIX}{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir(&dir)?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let path = dir.join("events.sock");
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let acceptor = {
            let (stop, readers) = (stop.clone(), readers.clone());
            std::thread::spawn(move || accept(listener, &stop, &readers))
        };
        let end = NodeEnd {
            dir,
            stop,
            acceptor: Some(acceptor),
            readers,
        };
        Ok((end, path))
    }

    /// Once the instance's processes are gone: stops listening, waits until every line sent
    /// has been written out, and removes the socket.
    pub(crate) fn finish(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let readers = std::mem::take(&mut *self.readers.lock().unwrap_or_else(|e| e.into_inner()));
        for r in readers {
            let _ = r.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn accept(listener: UnixListener, stop: &AtomicBool, readers: &Mutex<Vec<JoinHandle<()>>>) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let reader = std::thread::spawn(move || forward_lines(stream));
                readers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(reader);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return,
        }
    }
}

/// Every line of `stream` to stdout, each with [`PREFIX`] and in one write.
fn forward_lines(stream: UnixStream) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                let mut out = Vec::with_capacity(PREFIX.len() + line.len());
                out.extend_from_slice(PREFIX);
                out.extend_from_slice(&line);
                let mut stdout = std::io::stdout().lock();
                let _ = stdout.write_all(&out).and_then(|()| stdout.flush());
            }
        }
    }
}

/// The batch node's end: copies `from` (srun's stdout) to `log`, except relayed event lines,
/// which go to the event socket `socket` (connected at the first). Returns at end of file.
pub(crate) fn split(from: impl std::io::Read, mut log: impl Write, socket: Option<&Path>) {
    let mut reader = BufReader::new(from);
    let mut events: Option<UnixStream> = None;
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        match (line.strip_prefix(PREFIX), socket) {
            (Some(event), Some(path)) => {
                if events.is_none() {
                    events = UnixStream::connect(path).ok();
                }
                if let Some(s) = events.as_mut() {
                    if s.write_all(event).is_err() {
                        events = None;
                    }
                }
            }
            (Some(_), None) => {}
            (None, _) => {
                let _ = log.write_all(&line);
            }
        }
        if reader.buffer().is_empty() {
            let _ = log.flush();
        }
    }
    let _ = log.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lines_go_to_the_socket_and_the_rest_to_the_log() {
        let dir = e2e_tests::Scratch::new("relay-split");
        let path = dir.join("events.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let mut input = Vec::new();
        input.extend_from_slice(b"user line 1\n");
        input.extend_from_slice(PREFIX);
        input.extend_from_slice(b"{\"v\":1,\"event\":\"progress\",\"step\":1}\n");
        input.extend_from_slice(b"user line 2 without end");
        let mut log = Vec::new();
        let reader = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut got = String::new();
            BufReader::new(stream).read_line(&mut got).unwrap();
            got
        });
        split(&input[..], &mut log, Some(&path));
        assert_eq!(log, b"user line 1\nuser line 2 without end");
        assert_eq!(
            reader.join().unwrap(),
            "{\"v\":1,\"event\":\"progress\",\"step\":1}\n"
        );
    }
}
