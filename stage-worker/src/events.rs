//! The event channel: one [`WorkerMessage`] JSON object per line, to the orchestrator's Unix
//! socket (named by `ORCHESTRATE_EVENTS`) or, when that is unset, to stdout.

use protocol::checkpoint::{Checksum, FileIdentity, ManifestFile};
use protocol::worker::{WorkerEvent, WorkerMessage, ENV_EVENTS};
use protocol::PROTOCOL_VERSION;
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// A checkpoint file that was written: its path and its manifest entry (what a `checkpoint`
/// event reports of it, see [`EventSink::checkpoint_files`]).
#[derive(Debug, Clone, PartialEq)]
pub struct WrittenFile {
    /// Path of the file (the output directory joined with the entry's path).
    pub path: PathBuf,
    /// Size and checksum.
    pub entry: ManifestFile,
    /// Which file it is on disk, once in place (for the orchestrator to recognise it).
    pub identity: Option<FileIdentity>,
    /// When its writing passed each phase, as `t_*` metrics (files streamed from tensors:
    /// `t_copied_STEM`, `t_hashed_STEM`, `t_written_STEM`, `t_synced_STEM`).
    pub phases: Vec<(String, f64)>,
}

enum Target {
    Socket(UnixStream),
    Stdout,
    /// Collected in memory (tests).
    #[cfg(test)]
    Memory(Vec<WorkerMessage>),
}

/// Where events go. Writing never fails the stage: if the channel breaks, the first error is
/// logged on stderr and later events are dropped.
pub struct EventSink {
    target: Target,
    broken: bool,
}

impl EventSink {
    /// Opens the channel named by `ORCHESTRATE_EVENTS`, or stdout when the variable is unset or
    /// empty. Fails only when the variable names a socket that cannot be connected to.
    pub fn from_env() -> io::Result<Self> {
        match std::env::var_os(ENV_EVENTS) {
            Some(path) if !path.is_empty() => Self::connect(Path::new(&path)),
            _ => Ok(Self::stdout()),
        }
    }

    /// Connects to the Unix stream socket at `path`.
    pub fn connect(path: &Path) -> io::Result<Self> {
        let stream = UnixStream::connect(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot connect to the event socket {} ({ENV_EVENTS}): {e}",
                    path.display()
                ),
            )
        })?;
        Ok(EventSink {
            target: Target::Socket(stream),
            broken: false,
        })
    }

    /// Writes events to stdout.
    pub fn stdout() -> Self {
        EventSink {
            target: Target::Stdout,
            broken: false,
        }
    }

    /// Keeps events in memory; see [`EventSink::recorded`].
    #[cfg(test)]
    pub fn memory() -> Self {
        EventSink {
            target: Target::Memory(Vec::new()),
            broken: false,
        }
    }

    /// The events sent so far to an in-memory sink.
    #[cfg(test)]
    pub fn recorded(&self) -> &[WorkerMessage] {
        match &self.target {
            Target::Memory(v) => v,
            _ => &[],
        }
    }

    /// Sends one event, stamped with [`PROTOCOL_VERSION`], as one line.
    pub fn send(&mut self, event: WorkerEvent) {
        if self.broken {
            return;
        }
        let message = WorkerMessage {
            v: PROTOCOL_VERSION,
            event,
        };
        let mut line = serde_json::to_string(&message).expect("worker messages always serialize");
        line.push('\n');
        let result = match &mut self.target {
            Target::Socket(stream) => stream.write_all(line.as_bytes()),
            Target::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(line.as_bytes()).and_then(|()| out.flush())
            }
            #[cfg(test)]
            Target::Memory(v) => {
                v.push(message);
                Ok(())
            }
        };
        if let Err(e) = result {
            crate::log!("event channel broken ({e}); further events are dropped");
            self.broken = true;
        }
    }

    /// `finishing`: the stage's device work ends in a moment (its last step is done; the
    /// final checkpoint's copies off the device and the release follow).
    pub fn finishing(&mut self) {
        self.send(WorkerEvent::Finishing {});
    }

    /// `started`: the device is ready.
    pub fn started(&mut self, device: &str) {
        self.send(WorkerEvent::Started {
            pid: Some(std::process::id()),
            device: Some(device.to_string()),
        });
    }

    /// `progress`: steps done of `total`, the latest loss and the recent throughput.
    pub fn progress(
        &mut self,
        step: u64,
        total: u64,
        loss: Option<f64>,
        tokens_per_s: Option<f64>,
    ) {
        self.send(WorkerEvent::Progress {
            step,
            total_steps: Some(total),
            loss: loss.filter(|l| l.is_finite()),
            tokens_per_s: tokens_per_s.filter(|t| t.is_finite()),
        });
    }

    /// `checkpoint`: a file of a complete checkpoint is durably in place.
    pub fn checkpoint(
        &mut self,
        path: PathBuf,
        checksum: Checksum,
        bytes: u64,
        step: Option<u64>,
        identity: Option<FileIdentity>,
    ) {
        let (sha256, blake3) = checksum.into_event();
        self.send(WorkerEvent::Checkpoint {
            path,
            sha256,
            blake3,
            bytes: Some(bytes),
            step,
            identity,
        });
    }

    /// `checkpoint` for each file of a checkpoint just written (see [`WrittenFile`]), as of
    /// `step`.
    pub fn checkpoint_files(&mut self, files: Vec<WrittenFile>, step: Option<u64>) {
        for f in files {
            self.checkpoint(f.path, f.entry.checksum, f.entry.bytes, step, f.identity);
        }
    }

    /// `metrics`: final named figures (non-finite values are dropped: JSON cannot carry them).
    pub fn metrics(&mut self, metrics: &BTreeMap<String, f64>) {
        let metrics = metrics
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        self.send(WorkerEvent::Metrics { metrics });
    }

    /// Reports that the stage's device work is over (its CUDA context destroyed), on a
    /// connection of its own: the thread that released the device calls it while the stage's
    /// main sink is busy writing the checkpoint. Errors are ignored (the orchestrator then
    /// simply hands the GPU on after the stage ends). The checkpoint being written puts its
    /// manifest in place last, so a downstream stage may start now.
    pub fn announce_released() {
        if let Ok(mut sink) = Self::from_env() {
            sink.send(WorkerEvent::Released {
                pid: Some(std::process::id()),
                downstream_may_start: true,
            });
        }
    }

    /// `done`: the stage succeeded; the process exits 0 next.
    pub fn done(&mut self) {
        self.send(WorkerEvent::Done {});
    }

    /// `failed`: the stage failed; the process exits non-zero next.
    pub fn failed(&mut self, error: &str, reason: &str) {
        self.send(WorkerEvent::Failed {
            error: error.to_string(),
            reason: Some(reason.to_string()),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixListener;

    #[test]
    fn socket_lines_are_versioned_messages() {
        let dir = crate::testutil::scratch_dir("events");
        let path = dir.join("events.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let mut sink = EventSink::connect(&path).unwrap();
        let (conn, _) = listener.accept().unwrap();
        sink.started("cpu");
        sink.progress(3, 10, Some(1.5), Some(f64::NAN));
        sink.done();
        drop(sink);
        let lines: Vec<String> = BufReader::new(conn).lines().map(Result::unwrap).collect();
        assert_eq!(lines.len(), 3);
        let first: WorkerMessage = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(first.v, PROTOCOL_VERSION);
        assert!(matches!(
            first.event,
            WorkerEvent::Started { pid: Some(_), .. }
        ));
        let second: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(second["event"], "progress");
        assert_eq!(second["step"], 3);
        assert!(
            second["tokens_per_s"].is_null(),
            "NaN must not be sent: {second}"
        );
        assert!(lines[2].contains("\"event\":\"done\""));
    }
}
