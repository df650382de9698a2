//! The run journal: an append-only JSON-lines file, fsynced at every state change.
//!
//! Each line is one [`JournalRecord`] with the protocol version and a timestamp. A crash at any
//! instant leaves every line but possibly the last complete; readers skip a torn last line.

use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// One state change of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rec", rename_all = "snake_case")]
pub enum JournalRecord {
    /// The run began.
    RunStarted {
        /// Path of the plan file.
        plan: String,
        /// PID of the orchestrator.
        pid: u32,
        /// Whether GPU memory is being verified, or why not.
        gpu_check: String,
    },
    /// An attempt of a stage was launched.
    StageStarted {
        /// Stage name.
        stage: String,
        /// Attempt number, from 1.
        attempt: u32,
        /// PID of the stage's first process.
        pid: u32,
        /// UUIDs of the GPUs it was given.
        gpus: Vec<String>,
    },
    /// An attempt ended.
    StageFinished {
        /// Stage name.
        stage: String,
        /// Attempt number.
        attempt: u32,
        /// "succeeded", "failed" or "cancelled".
        status: String,
        /// Why it failed, when it did.
        #[serde(default)]
        error: Option<String>,
        /// Verified outputs with checksums (on success).
        #[serde(default)]
        checkpoints: Vec<protocol::report::CheckpointRecord>,
    },
    /// A stage will not run because an upstream stage failed or the run stopped.
    StageSkipped {
        /// Stage name.
        stage: String,
        /// Why.
        reason: String,
    },
    /// The run ended.
    RunFinished {
        /// "succeeded", "failed", "interrupted" or "leaked".
        status: String,
        /// Exit status of `orchestrate`.
        exit_code: i32,
    },
}

#[derive(Serialize)]
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
}

impl Journal {
    /// Opens (creating) the journal at `path` for appending.
    pub fn open(path: &Path) -> io::Result<Journal> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(Journal { file })
    }

    /// Appends `record` as one line and fsyncs before returning.
    pub fn append(&mut self, record: &JournalRecord) -> io::Result<()> {
        let line = Line {
            v: protocol::PROTOCOL_VERSION,
            t: crate::timefmt::unix_ms(),
            record,
        };
        let mut bytes = serde_json::to_vec(&line).map_err(io::Error::other)?;
        bytes.push(b'\n');
        self.file.write_all(&bytes)?;
        self.file.sync_data()
    }
}

/// Reads every complete record of a journal, skipping a torn last line.
pub fn read_journal(path: &Path) -> io::Result<Vec<JournalRecord>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_and_reads_back_skipping_a_torn_tail() {
        let dir = std::env::temp_dir().join(format!("journal-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("journal.jsonl");
        let _ = std::fs::remove_file(&path);
        let mut journal = Journal::open(&path).unwrap();
        let first = JournalRecord::StageSkipped {
            stage: "a".into(),
            reason: "upstream failed".into(),
        };
        journal.append(&first).unwrap();
        journal
            .append(&JournalRecord::RunFinished {
                status: "failed".into(),
                exit_code: 1,
            })
            .unwrap();
        let mut torn = OpenOptions::new().append(true).open(&path).unwrap();
        torn.write_all(b"{\"v\":1,\"t\":5,\"rec\":\"stage_sta")
            .unwrap();
        let records = read_journal(&path).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0], first);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
