//! Reading a run's stage logs as they grow: what `orchestrate logs` prints and follows.
//!
//! Each stage writes `stages/<name>/stdout.log` and `stderr.log` (every attempt, a header line
//! per attempt). A [`LogTail`] reads the complete lines added since its last look, stage by
//! stage, and — when it reads every stage — picks up the directories of stages that start
//! later. A line still being written (no newline yet) is left for the next look, so a followed
//! line is never cut in two. Stages are read in the order they started, as the run's journal
//! records it (their directories and logs are made ahead of their start, so neither tells),
//! stages not started yet last: a look that finds an upstream's last lines and its
//! downstream's first prints them in that order.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The two log files of a stage, in the order their lines are read at each look.
const FILES: [&str; 2] = ["stdout.log", "stderr.log"];

/// A line of a stage's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// The stage's directory name under `stages/` (its name; an instance's is `base[k=v]`).
    pub stage: String,
    /// The line, without its newline.
    pub text: String,
}

/// One log file being read: where the next unread byte is.
struct Tailed {
    path: PathBuf,
    offset: u64,
}

/// The logs of one stage or of every stage of a run, read from where the last look ended.
pub struct LogTail {
    stages_dir: PathBuf,
    /// `Some(name)`: that stage only; `None`: every stage, those that start later included.
    only: Option<String>,
    /// Each stage found so far with its two files, in the order the stages started.
    files: Vec<(String, Vec<Tailed>)>,
    /// The run's journal, read as it grows for the order stages started in.
    journal: Tailed,
    /// Each stage's place in the order of first starts.
    started: std::collections::HashMap<String, usize>,
}

impl LogTail {
    /// The logs of the run in `root`: stage `only`'s, or every stage's. A stage that has not
    /// started yet has no files; its lines appear once it writes them.
    pub fn new(root: &Path, only: Option<&str>) -> LogTail {
        LogTail {
            stages_dir: root.join("stages"),
            only: only.map(str::to_string),
            files: Vec::new(),
            journal: Tailed {
                path: root.join("journal.jsonl"),
                offset: 0,
            },
            started: std::collections::HashMap::new(),
        }
    }

    /// Whether stage `name` has a directory in the run (it started at least once).
    pub fn stage_started(&self, name: &str) -> bool {
        self.stages_dir.join(name).is_dir()
    }

    /// The complete lines written since the last call, each stage's in order (stdout's new
    /// lines, then stderr's), the stages in the order they started.
    pub fn read_new(&mut self) -> io::Result<Vec<LogLine>> {
        self.find_stages()?;
        self.order_by_start()?;
        let mut lines = Vec::new();
        for (stage, files) in &mut self.files {
            for file in files.iter_mut() {
                for text in file.read_lines()? {
                    lines.push(LogLine {
                        stage: stage.clone(),
                        text,
                    });
                }
            }
        }
        Ok(lines)
    }

    /// Puts the stages in the order the journal says they first started, those not started
    /// (prepared ahead) last, by name.
    fn order_by_start(&mut self) -> io::Result<()> {
        let before = self.started.len();
        for line in self.journal.read_lines()? {
            let Ok(record) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if record["rec"] == "stage_started" {
                if let Some(stage) = record["stage"].as_str() {
                    let next = self.started.len();
                    self.started.entry(stage.to_string()).or_insert(next);
                }
            }
        }
        if self.started.len() != before || self.files.len() > 1 {
            let started = &self.started;
            self.files.sort_by_key(|(name, _)| {
                (
                    started.get(name).copied().unwrap_or(usize::MAX),
                    name.clone(),
                )
            });
        }
        Ok(())
    }

    /// Adds the stages whose directories appeared since the last look.
    fn find_stages(&mut self) -> io::Result<()> {
        let names: Vec<String> = match &self.only {
            Some(name) => vec![name.clone()],
            None => match std::fs::read_dir(&self.stages_dir) {
                Ok(entries) => entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(e),
            },
        };
        let mut found: Vec<(Option<std::time::SystemTime>, String)> = names
            .into_iter()
            .filter(|name| !self.files.iter().any(|(known, _)| known == name))
            .filter_map(|name| {
                let meta = std::fs::metadata(self.stages_dir.join(&name)).ok()?;
                meta.is_dir().then(|| (meta.created().ok(), name))
            })
            .collect();
        found.sort();
        for (_, name) in found {
            let dir = self.stages_dir.join(&name);
            let files = FILES
                .iter()
                .map(|f| Tailed {
                    path: dir.join(f),
                    offset: 0,
                })
                .collect();
            self.files.push((name, files));
        }
        Ok(())
    }
}

impl Tailed {
    /// The complete lines past `offset`; `offset` moves past them. A file not there yet reads
    /// as empty.
    fn read_lines(&mut self) -> io::Result<Vec<String>> {
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        if file.metadata()?.len() <= self.offset {
            return Ok(Vec::new());
        }
        file.seek(SeekFrom::Start(self.offset))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else {
            return Ok(Vec::new());
        };
        self.offset += end as u64 + 1;
        Ok(String::from_utf8_lossy(&bytes[..end])
            .split('\n')
            .map(str::to_string)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn append(path: &Path, text: &str) {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }

    #[test]
    fn new_complete_lines_once_each_and_a_later_stage_picked_up() {
        let root = crate::testutil::scratch("logs");
        let a = root.path().join("stages/a");
        std::fs::create_dir_all(&a).unwrap();
        append(&a.join("stdout.log"), "one\ntw");
        let mut tail = LogTail::new(root.path(), None);
        let texts = |lines: Vec<LogLine>| {
            lines
                .into_iter()
                .map(|l| format!("{}:{}", l.stage, l.text))
                .collect::<Vec<_>>()
        };
        assert_eq!(texts(tail.read_new().unwrap()), ["a:one"]);
        // The half-written line waits for its newline; a new stage appears.
        append(&a.join("stdout.log"), "o\n");
        let b = root.path().join("stages/b");
        std::fs::create_dir_all(&b).unwrap();
        append(&b.join("stderr.log"), "warn\n");
        assert_eq!(texts(tail.read_new().unwrap()), ["a:two", "b:warn"]);
        assert!(tail.read_new().unwrap().is_empty(), "nothing read twice");
    }

    #[test]
    fn stages_are_read_in_the_order_the_journal_says_they_started() {
        let root = crate::testutil::scratch("logs");
        // `b` is prepared (its directory made) before `a`, but `a` starts first.
        for name in ["b", "a"] {
            std::fs::create_dir_all(root.path().join("stages").join(name)).unwrap();
        }
        let journal = root.path().join("journal.jsonl");
        append(
            &journal,
            "{\"v\":1,\"rec\":\"stage_started\",\"stage\":\"a\",\"attempt\":1}\n",
        );
        append(&root.path().join("stages/a/stdout.log"), "a1\n");
        let mut tail = LogTail::new(root.path(), None);
        assert_eq!(tail.read_new().unwrap().len(), 1);
        // In one look: `a`'s last line and `b`'s first, after `b` started.
        append(&root.path().join("stages/a/stdout.log"), "a2\n");
        append(
            &journal,
            "{\"v\":1,\"rec\":\"stage_started\",\"stage\":\"b\",\"attempt\":1}\n",
        );
        append(&root.path().join("stages/b/stdout.log"), "b1\n");
        let texts: Vec<String> = tail
            .read_new()
            .unwrap()
            .into_iter()
            .map(|l| l.text)
            .collect();
        assert_eq!(texts, ["a2", "b1"]);
    }

    #[test]
    fn one_stage_only_and_a_stage_not_started_reads_empty() {
        let root = crate::testutil::scratch("logs");
        for name in ["a", "b"] {
            let dir = root.path().join("stages").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            append(&dir.join("stdout.log"), &format!("{name}\n"));
        }
        let mut tail = LogTail::new(root.path(), Some("b"));
        let lines = tail.read_new().unwrap();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].text, "b");
        let mut later = LogTail::new(root.path(), Some("c"));
        assert!(!later.stage_started("c"));
        assert!(later.read_new().unwrap().is_empty());
    }
}
