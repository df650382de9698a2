//! The run journal: an append-only JSON-lines file, the durable record of every state change.
//!
//! Each line is one [`JournalRecord`] with the protocol version and a timestamp. A crash at any
//! instant leaves every line but possibly the last complete; readers skip a torn last line.
//!
//! Durability: every record is written to the file (the kernel's page cache) before
//! `Journal::append` returns, so a killed `orchestrate` (`kill -9`, OOM) loses nothing, with
//! one exception: a stage's start is written with the next record, or by
//! `Journal::flush_pending` (the run loop calls it at least every quarter second while one
//! waits), one `write` fewer per stage of a sweep. A killed `orchestrate` may lose the start of
//! a stage that began less than that ago: the stage then counts as not started and runs again
//! on resume (its output directory, not the journal, says whether an earlier attempt left
//! files there). What a machine crash may lose is bounded by when records reach the disk:
//! - the run's start and end, Slurm records, and every record appended with
//!   [`Journal::append_durable`] are fsynced before the call returns;
//! - a stage's end (finished or skipped) is fsynced within `GROUP_COMMIT`: finishes that
//!   come close together share one fsync (group commit), so a sweep of short stages does not
//!   pay one disk flush per stage; a crash can lose only the last `GROUP_COMMIT` of them,
//!   and those stages run again on resume;
//! - a stage's start is not fsynced on its own (losing it means the stage counts as not
//!   started, and runs again on resume); the next fsync covers it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How long a stage's end record may wait for the fsync it shares with the ends around it.
/// Each fsync is a flush of the disk's write cache and its interrupts; a machine crash can
/// undo at most this much of stage ends (those stages run again on resume). The measurements
/// behind 100 ms: `bench/overhead/README.md`, the tenth round.
pub(crate) const GROUP_COMMIT: Duration = Duration::from_millis(100);

pub use protocol::journal::JournalRecord;

/// A journal line as serde would write it: the version and time, then the record's fields.
/// [`Journal::write`] writes the same bytes without `flatten`'s map (see [`write_line`]).
#[cfg(test)]
#[derive(serde::Serialize)]
struct Line<'a> {
    v: u32,
    t: u64,
    #[serde(flatten)]
    record: &'a JournalRecord,
}

/// An open journal, appending.
#[derive(Debug)]
pub struct Journal {
    file: File,
    path: std::path::PathBuf,
    root: std::path::PathBuf,
    flusher: Flusher,
    /// The line being written, its buffer kept from one record to the next.
    line: Vec<u8>,
    /// Stage starts not written yet (whole lines), written before the next record.
    pending: Vec<u8>,
}

/// The group-commit thread: fsyncs the journal within [`GROUP_COMMIT`] of a record that asked
/// for it, once for all the records written meanwhile.
#[derive(Debug)]
struct Flusher {
    shared: Arc<(Mutex<FlushState>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct FlushState {
    /// Records written since the last fsync that must reach the disk.
    dirty: bool,
    /// The journal is being closed: flush what is dirty and stop.
    closing: bool,
    /// The last background fsync's failure, reported by the next append.
    error: Option<io::Error>,
}

impl Flusher {
    fn start(file: &File) -> io::Result<Flusher> {
        let file = file.try_clone()?;
        let shared = Arc::new((Mutex::new(FlushState::default()), Condvar::new()));
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("journal-sync".into())
            .spawn(move || {
                let (lock, cv) = &*theirs;
                let mut state = lock.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    while !state.dirty && !state.closing {
                        state = cv.wait(state).unwrap_or_else(|p| p.into_inner());
                    }
                    if !state.dirty {
                        return; // closing, nothing to flush
                    }
                    if !state.closing {
                        // Let the records of the next few milliseconds share this fsync (a
                        // close cuts the wait short: the run's end need not wait for it).
                        state = cv
                            .wait_timeout_while(state, GROUP_COMMIT / 2, |s| !s.closing)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                    }
                    state.dirty = false;
                    drop(state);
                    let result = file.sync_data();
                    state = lock.lock().unwrap_or_else(|p| p.into_inner());
                    if let Err(e) = result {
                        state.error = Some(e);
                    }
                }
            })?;
        Ok(Flusher {
            shared,
            thread: Some(thread),
        })
    }

    /// Asks for an fsync within [`GROUP_COMMIT`]; returns a failure of an earlier one.
    fn request(&self) -> io::Result<()> {
        let (lock, cv) = &*self.shared;
        let mut state = lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = state.error.take() {
            return Err(e);
        }
        // Only the first record after an fsync wakes the thread: while `dirty` is set, it is
        // either waiting out the group window or about to begin another round, and the fsync
        // it does next covers this record (written before this call). Waking it for every
        // record would cost two context switches per stage end for nothing.
        if !state.dirty {
            state.dirty = true;
            cv.notify_one();
        }
        Ok(())
    }

    /// Notes that an fsync is about to cover everything written so far.
    fn covered(&self) -> io::Result<()> {
        let (lock, _) = &*self.shared;
        let mut state = lock.lock().unwrap_or_else(|p| p.into_inner());
        state.dirty = false;
        match state.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        {
            let (lock, cv) = &*self.shared;
            let mut state = lock.lock().unwrap_or_else(|p| p.into_inner());
            state.closing = true;
            cv.notify_one();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        let _ = self.flush_pending();
    }
}

/// When a record must reach the disk.
enum Durability {
    /// Before `append` returns.
    Now,
    /// Within [`GROUP_COMMIT`], sharing an fsync with its neighbours.
    Grouped,
    /// Written with the next record (or [`Journal::flush_pending`]); on disk with the next
    /// fsync after that.
    Lazy,
}

/// Adds the path an I/O error is about to its message.
fn at(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

impl Journal {
    /// Opens (creating) the journal at `path` for appending. Output paths inside the
    /// journal's directory are recorded relative to it.
    pub fn open(path: &Path) -> io::Result<Journal> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| at(path, e))?;
        let root = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        File::open(&root)
            .and_then(|d| d.sync_all())
            .map_err(|e| at(&root, e))?;
        let flusher = Flusher::start(&file).map_err(|e| at(path, e))?;
        Ok(Journal {
            file,
            path: path.to_path_buf(),
            root,
            flusher,
            line: Vec::new(),
            pending: Vec::new(),
        })
    }

    /// Appends `record` as one line, written before returning and fsynced as the module
    /// documentation says for its kind. An error names the journal.
    pub(crate) fn append(&mut self, record: &JournalRecord) -> io::Result<()> {
        let durability = match record {
            JournalRecord::StageStarted { .. } => Durability::Lazy,
            JournalRecord::StageFinished { .. } | JournalRecord::StageSkipped { .. } => {
                Durability::Grouped
            }
            _ => Durability::Now,
        };
        self.write(record, durability)
    }

    /// Appends `record` and fsyncs it (with everything before it) before returning.
    pub fn append_durable(&mut self, record: &JournalRecord) -> io::Result<()> {
        self.write(record, Durability::Now)
    }

    /// Whether a stage's start waits to be written (see [`Journal::flush_pending`]).
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Writes the stage starts appended since the last record (they are otherwise written
    /// with the next one).
    pub(crate) fn flush_pending(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let written = self
            .file
            .write_all(&self.pending)
            .map_err(|e| at(&self.path, e));
        self.pending.clear();
        written
    }

    /// Fsyncs everything appended so far before returning.
    pub fn sync(&mut self) -> io::Result<()> {
        self.flush_pending()?;
        self.flusher
            .covered()
            .and_then(|()| self.file.sync_data())
            .map_err(|e| at(&self.path, e))
    }

    fn write(&mut self, record: &JournalRecord, durability: Durability) -> io::Result<()> {
        let relative;
        let record = match record {
            JournalRecord::StageFinished { checkpoints, .. } if !checkpoints.is_empty() => {
                let mut r = record.clone();
                if let JournalRecord::StageFinished { checkpoints, .. } = &mut r {
                    for c in checkpoints {
                        if let Ok(rest) = Path::new(&c.path).strip_prefix(&self.root) {
                            c.path = rest.display().to_string();
                        }
                    }
                }
                relative = r;
                &relative
            }
            _ => record,
        };
        write_line(&mut self.line, crate::timefmt::unix_ms(), record)?;
        if let Durability::Lazy = durability {
            self.pending.extend_from_slice(&self.line);
            return Ok(());
        }
        let bytes = if self.pending.is_empty() {
            &self.line
        } else {
            self.pending.extend_from_slice(&self.line);
            &self.pending
        };
        let written = self.file.write_all(bytes).map_err(|e| at(&self.path, e));
        self.pending.clear();
        written?;
        match durability {
            Durability::Now => self.sync(),
            Durability::Grouped => self.flusher.request().map_err(|e| at(&self.path, e)),
            Durability::Lazy => Ok(()),
        }
    }
}

/// Writes `record`'s line (time `t`, this protocol's version) into `line`, which it clears:
/// `{"v":V,"t":T`, then the record's own object with its `{` turned into the `,` that joins
/// its fields on (every record has at least its `rec` tag), and a newline. The bytes of
/// [`Line`] serialized, without the map that serde's `flatten` builds field by field (a
/// stage's start and end are two lines).
fn write_line(line: &mut Vec<u8>, t: u64, record: &JournalRecord) -> io::Result<()> {
    line.clear();
    write!(line, "{{\"v\":{},\"t\":{t}", protocol::PROTOCOL_VERSION)?;
    let start = line.len();
    serde_json::to_writer(&mut *line, record).map_err(io::Error::other)?;
    if line.get(start) != Some(&b'{') || line.get(start + 1) == Some(&b'}') {
        return Err(io::Error::other(
            "a journal record is not a JSON object with fields",
        ));
    }
    line[start] = b',';
    line.push(b'\n');
    Ok(())
}

/// Reads the journal of the run in `root` with every recorded output path resolved against
/// `root` (they are stored relative to it; older journals hold absolute paths, kept as they
/// are).
pub fn read_run_journal(root: &Path) -> io::Result<Vec<JournalRecord>> {
    let path = root.join(crate::store::rundir::JOURNAL_FILE);
    let mut records = read_journal(&path).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidData => e, // names the file already
        _ => at(&path, e),
    })?;
    for record in &mut records {
        if let JournalRecord::StageFinished { checkpoints, .. } = record {
            for c in checkpoints {
                c.path = root.join(&c.path).display().to_string();
            }
        }
    }
    Ok(records)
}

/// Cuts a torn last line (a write that never finished) off the journal, so appends after it
/// start on a line of their own. Returns whether anything was cut.
pub(crate) fn repair_tail(path: &Path) -> io::Result<bool> {
    let bytes = std::fs::read(path)?;
    if bytes.is_empty() || bytes.ends_with(b"\n") {
        return Ok(false);
    }
    let keep = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let file = OpenOptions::new().write(true).open(path)?;
    file.set_len(keep as u64)?;
    file.sync_all()?;
    Ok(true)
}

/// Reads every complete record of a journal, skipping a torn last line.
pub(crate) fn read_journal(path: &Path) -> io::Result<Vec<JournalRecord>> {
    let text = std::fs::read_to_string(path)?;
    let mut records = Vec::new();
    let lines: Vec<&str> = text.split('\n').collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<JournalRecord>(line) {
            Ok(record) => records.push(record),
            Err(_) if i + 1 == lines.len() => break, // torn tail: the write never finished
            Err(e) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: line {} is not a journal record: {e}",
                        path.display(),
                        i + 1
                    ),
                ))
            }
        }
    }
    Ok(records)
}

/// An attempt the journal shows started and not (yet) finished: in a live run, a running
/// stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAttempt {
    /// Stage name.
    pub stage: String,
    /// Attempt number.
    pub attempt: u32,
    /// PID of its first process.
    pub pid: u32,
    /// When it started (the record's `t`), milliseconds since the epoch; 0 if not recorded.
    pub since_ms: u64,
}

/// The attempts of the journal at `path` that started and have no finish record after them,
/// in the order they started (what `status` shows as running while the run is live).
pub fn open_attempts(path: &Path) -> io::Result<Vec<OpenAttempt>> {
    let text = std::fs::read_to_string(path)?;
    let mut open: Vec<OpenAttempt> = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(record) = serde_json::from_str::<JournalRecord>(line) else {
            continue; // a torn last line, or a line `read_journal` reports
        };
        match record {
            JournalRecord::StageStarted {
                stage,
                attempt,
                pid,
                ..
            } => {
                let since_ms = serde_json::from_str::<serde_json::Value>(line)
                    .ok()
                    .and_then(|v| v.get("t")?.as_u64())
                    .unwrap_or(0);
                open.retain(|a| a.stage != stage);
                open.push(OpenAttempt {
                    stage,
                    attempt,
                    pid,
                    since_ms,
                });
            }
            JournalRecord::StageFinished { stage, .. } => open.retain(|a| a.stage != stage),
            _ => {}
        }
    }
    Ok(open)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_written_as_serde_wrote_it_with_flatten() {
        let checkpoint: protocol::report::CheckpointRecord = serde_json::from_str(
            r#"{"path": "out/model.safetensors", "bytes": 12, "blake3": "00ff"}"#,
        )
        .unwrap();
        let records = [
            JournalRecord::RunStarted {
                plan: "/p/plan \"x\".toml".into(),
                pid: 42,
                gpu_check: "on".into(),
                resumed: true,
            },
            JournalRecord::StageStarted {
                stage: "s1".into(),
                attempt: 1,
                pid: 77,
                gpus: vec!["GPU-1".into(), "GPU-2".into()],
                plan_hash: "abc".into(),
            },
            JournalRecord::StageFinished {
                stage: "é\u{1}".into(),
                attempt: 2,
                status: protocol::status::StageStatus::Failed,
                error: Some("exit 1\nbad".into()),
                checkpoints: vec![checkpoint],
                plan_hash: String::new(),
                metrics: [("loss".to_string(), 0.25), ("nan".to_string(), f64::NAN)].into(),
                wall_s: Some(1.5e-7),
            },
            JournalRecord::StageFinished {
                stage: "s".into(),
                attempt: 1,
                status: protocol::status::StageStatus::Succeeded,
                error: None,
                checkpoints: Vec::new(),
                plan_hash: "h".into(),
                metrics: Default::default(),
                wall_s: None,
            },
            JournalRecord::StageSkipped {
                stage: "b".into(),
                reason: "upstream".into(),
            },
            JournalRecord::SlurmStarted {
                job_id: "1".into(),
                restart_count: 0,
                host: "n1".into(),
                nodelist: "n[1-2]".into(),
            },
            JournalRecord::SlurmStopped {
                job_id: "1".into(),
                restart_count: 3,
                signal: "SIGTERM".into(),
                cause: "time_limit".into(),
                job_state: "TIMEOUT".into(),
                requeue: "requested".into(),
            },
            JournalRecord::RunFinished {
                status: protocol::status::RunStatus::Succeeded,
                exit_code: 0,
            },
        ];
        let mut line = b"left over".to_vec();
        for record in &records {
            let t = 1_733_400_000_123;
            let mut expected = serde_json::to_vec(&Line {
                v: protocol::PROTOCOL_VERSION,
                t,
                record,
            })
            .unwrap();
            expected.push(b'\n');
            write_line(&mut line, t, record).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&line),
                String::from_utf8_lossy(&expected)
            );
        }
    }

    #[test]
    fn open_attempts_are_those_started_and_not_finished() {
        let dir = crate::testutil::scratch("journal-open");
        let path = dir.join("journal.jsonl");
        let started = |stage: &str, attempt, pid, t| {
            format!("{{\"v\":1,\"t\":{t},\"rec\":\"stage_started\",\"stage\":\"{stage}\",\"attempt\":{attempt},\"pid\":{pid},\"gpus\":[]}}\n")
        };
        let finished = |stage: &str, attempt| {
            format!("{{\"v\":1,\"t\":9,\"rec\":\"stage_finished\",\"stage\":\"{stage}\",\"attempt\":{attempt},\"status\":\"failed\"}}\n")
        };
        let text = [
            started("a", 1, 10, 1000),
            started("b", 1, 11, 1001),
            finished("a", 1),
            started("a", 2, 12, 2000),
            "{\"v\":1,\"t\":3000,\"rec\":\"stage_sta".to_string(),
        ]
        .concat();
        std::fs::write(&path, text).unwrap();
        let open = open_attempts(&path).unwrap();
        let got: Vec<_> = open
            .iter()
            .map(|a| (a.stage.as_str(), a.attempt, a.pid, a.since_ms))
            .collect();
        assert_eq!(got, [("b", 1, 11, 1001), ("a", 2, 12, 2000)]);
    }

    #[test]
    fn grouped_records_are_flushed_within_the_group_window_however_they_arrive() {
        let dir = crate::testutil::scratch("journal-group");
        let mut journal = Journal::open(&dir.join("journal.jsonl")).unwrap();
        let end = |i: usize| JournalRecord::StageSkipped {
            stage: format!("s{i}"),
            reason: "test".into(),
        };
        let flushed = |journal: &Journal| {
            let deadline = std::time::Instant::now() + GROUP_COMMIT * 10;
            loop {
                if !journal.flusher.shared.0.lock().unwrap().dirty {
                    return true;
                }
                if std::time::Instant::now() > deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // A burst (one wake-up for all), records while an fsync is under way, and single ones
        // after quiet spells: each time, the flusher gets to them.
        for round in 0..20 {
            for i in 0..(round % 4) * 50 + 1 {
                journal.append(&end(i)).unwrap();
            }
            if round % 3 == 0 {
                std::thread::sleep(GROUP_COMMIT);
            }
            assert!(
                flushed(&journal),
                "round {round}: a grouped record was never flushed"
            );
        }
        drop(journal);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn appends_and_reads_back_skipping_a_torn_tail() {
        let dir = crate::testutil::scratch("journal");
        let path = dir.join("journal.jsonl");
        let mut journal = Journal::open(&path).unwrap();
        let first = JournalRecord::StageSkipped {
            stage: "a".into(),
            reason: "upstream failed".into(),
        };
        journal.append(&first).unwrap();
        journal
            .append(&JournalRecord::RunFinished {
                status: protocol::status::RunStatus::Failed,
                exit_code: 1,
            })
            .unwrap();
        let mut torn = OpenOptions::new().append(true).open(&path).unwrap();
        torn.write_all(b"{\"v\":1,\"t\":5,\"rec\":\"stage_sta")
            .unwrap();
        let records = read_journal(&path).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0], first);
        assert!(repair_tail(&path).unwrap());
        assert!(std::fs::read(&path).unwrap().ends_with(b"\n"));
        assert_eq!(read_journal(&path).unwrap().len(), 2);
        assert!(!repair_tail(&path).unwrap(), "nothing more to cut");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stage_start_is_written_with_the_next_record_or_when_flushed_or_closed() {
        let dir = crate::testutil::scratch("journal-pending");
        let path = dir.join("journal.jsonl");
        let started = |stage: &str| JournalRecord::StageStarted {
            stage: stage.into(),
            attempt: 1,
            pid: 42,
            gpus: Vec::new(),
            plan_hash: "h".into(),
        };
        let skipped = JournalRecord::StageSkipped {
            stage: "b".into(),
            reason: "test".into(),
        };
        let mut journal = Journal::open(&path).unwrap();
        journal.append(&started("a")).unwrap();
        assert!(journal.has_pending());
        assert!(read_journal(&path).unwrap().is_empty(), "not written yet");
        // The next record takes it along, before itself.
        journal.append(&skipped).unwrap();
        assert!(!journal.has_pending());
        assert_eq!(
            read_journal(&path).unwrap(),
            vec![started("a"), skipped.clone()]
        );
        // Flushed on its own.
        journal.append(&started("c")).unwrap();
        journal.flush_pending().unwrap();
        assert_eq!(read_journal(&path).unwrap().len(), 3);
        // Closing the journal writes what waits.
        journal.append(&started("d")).unwrap();
        drop(journal);
        assert_eq!(read_journal(&path).unwrap()[3], started("d"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
