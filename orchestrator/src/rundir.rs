//! The run directory: everything one run leaves behind, in a layout users and tools rely on.
//!
//! ```text
//! <run>/plan.toml            the plan as given (source text)
//! <run>/plan.resolved.json   the plan after defaults, as the run used it
//! <run>/journal.jsonl        append-only record of every state change (fsynced)
//! <run>/report.json          one record per stage (rewritten atomically as the run goes)
//! <run>/gpu-timeline.csv     GPU memory sampled every 50 ms (when the GPU check runs)
//! <run>/gpu-memory.svg       the picture of it, stage spans and baselines marked
//! <run>/stages/<name>/spec.json     what the stage was given
//! <run>/stages/<name>/stdout.log    its stdout, all attempts (a header line per attempt)
//! <run>/stages/<name>/stderr.log    its stderr, likewise
//! <run>/stages/<name>/events.jsonl  the events it sent, timestamped
//! <run>/stages/<name>/output/       its outputs: what downstream stages receive
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A run directory on disk.
#[derive(Debug, Clone)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    /// Creates `dir` (and parents). Refuses a directory that already holds a journal, so one
    /// run never overwrites another; an empty existing directory is fine.
    pub fn create(dir: &Path) -> io::Result<RunDir> {
        fs::create_dir_all(dir)?;
        let root = fs::canonicalize(dir)?;
        if root.join("journal.jsonl").exists() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} already holds a run (journal.jsonl exists); choose another --run-dir",
                    root.display()
                ),
            ));
        }
        fs::create_dir_all(root.join("stages"))?;
        Ok(RunDir { root })
    }

    /// Opens the directory of an earlier run, to resume it: it must hold a journal.
    pub fn open_existing(dir: &Path) -> io::Result<RunDir> {
        let root = fs::canonicalize(dir)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        if !root.join("journal.jsonl").is_file() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} holds no run (no journal.jsonl) to resume; run without --resume to start one",
                    root.display()
                ),
            ));
        }
        fs::create_dir_all(root.join("stages"))?;
        Ok(RunDir { root })
    }

    /// A fresh directory under `parent` named `<name>-<UTC stamp>`, with a suffix if taken.
    pub fn create_fresh(parent: &Path, name: &str) -> io::Result<RunDir> {
        let stamp = crate::timefmt::compact_stamp(crate::timefmt::unix_ms() / 1000);
        fs::create_dir_all(parent)?;
        for n in 0..1000 {
            let candidate = if n == 0 {
                parent.join(format!("{name}-{stamp}"))
            } else {
                parent.join(format!("{name}-{stamp}-{n}"))
            };
            match fs::create_dir(&candidate) {
                Ok(()) => return RunDir::create(&candidate),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other("could not find a free run directory name"))
    }

    /// The absolute root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The journal file.
    pub fn journal_path(&self) -> PathBuf {
        self.root.join("journal.jsonl")
    }

    /// The report file.
    pub fn report_path(&self) -> PathBuf {
        self.root.join("report.json")
    }

    /// Stage `name`'s directory (logs, spec, events).
    pub fn stage_dir(&self, name: &str) -> PathBuf {
        self.root.join("stages").join(name)
    }

    /// Stage `name`'s output directory: what downstream stages receive.
    pub fn output_dir(&self, name: &str) -> PathBuf {
        self.stage_dir(name).join("output")
    }

    /// Creates the stage's directory and output directory.
    pub fn prepare_stage(&self, name: &str) -> io::Result<()> {
        fs::create_dir_all(self.output_dir(name))
    }

    /// Opens one of the stage's log files for appending (created if absent).
    pub fn open_log(&self, name: &str, file: &str) -> io::Result<File> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.stage_dir(name).join(file))
    }
}

/// Writes `bytes` to `path` so that readers see the old content or the new, never a mix:
/// a temporary file beside it, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}
