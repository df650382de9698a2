//! The run directory: everything one run leaves behind, in a layout users and tools rely on.
//!
//! ```text
//! <run>/run.json             the plan's format and base directory (see protocol::run)
//! <run>/lock                 held (flock) by the live orchestrate that owns the run; its pid
//! <run>/plan.toml|plan.json  the plan as given (source text, in its own format)
//! <run>/plan.resolved.json   the plan after defaults, as the run used it
//! <run>/journal.jsonl        append-only record of every state change (fsynced)
//! <run>/report.json          one record per stage (rewritten atomically as the run goes)
//! <run>/gpu-timeline.csv     GPU memory sampled every 50 ms (when the GPU check runs)
//! <run>/gpu-memory.svg       the picture of it, stage spans and baselines marked
//! <run>/stages/<name>/spec.json     what the stage was given
//! <run>/stages/<name>/inputs.json   its inputs: upstream stage name → output directory
//! <run>/stages/<name>/stdout.log    its stdout, all attempts (a header line per attempt)
//! <run>/stages/<name>/stderr.log    its stderr, likewise
//! <run>/stages/<name>/events.jsonl  the events it sent, timestamped
//! <run>/stages/<name>/output/       its outputs: what downstream stages receive
//! ```
//!
//! Promises:
//! - one live owner per directory: an exclusive `flock` on `<run>/lock` is held for the whole
//!   run and released by the kernel however the owner dies, so a second `orchestrate` (or a
//!   `resume` of a live run) is refused with the owner's pid, and `status`/`report` tell a live
//!   run from an interrupted one;
//! - never a write into a non-empty directory that is not a run directory;
//! - nothing recorded inside refers to the directory's absolute location (the journal stores
//!   output paths relative to it), so a moved or copied run directory resumes where it is.

use protocol::run::{PlanFormat, RunMeta};
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The lock file's name.
pub(crate) const LOCK_FILE: &str = "lock";
/// The run metadata file's name.
pub(crate) const META_FILE: &str = "run.json";
/// The journal's file name.
pub const JOURNAL_FILE: &str = "journal.jsonl";

/// Why a run directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    /// Another live `orchestrate` owns it.
    #[error("{dir} is in use by a live run: {owner}; one orchestrate at a time may own a run directory (wait for it to end, or stop it first)", dir = .dir.display())]
    InUse {
        /// The directory.
        dir: PathBuf,
        /// Who holds it.
        owner: LockOwner,
    },
    /// Non-empty and not a run directory: the user's own files are there.
    #[error("{dir} is not empty and is not a run directory: orchestrate would write plan, journal and report files among yours there; choose a new or empty --run-dir", dir = .dir.display())]
    NotARunDir {
        /// The directory.
        dir: PathBuf,
    },
    /// Already holds a (finished or interrupted) run.
    #[error("{dir} already holds a run: continue it with `orchestrate resume {dir}`, or choose another --run-dir", dir = .dir.display())]
    HoldsRun {
        /// The directory.
        dir: PathBuf,
    },
    /// The path given for a new run cannot be a directory: a file is there, a symbolic link
    /// that leads nowhere (or to a file), or a file among its parents.
    #[error("{dir} {why}: {help}", dir = .dir.display())]
    NotADirectory {
        /// The path.
        dir: PathBuf,
        /// What it is ("is a regular file, not a directory").
        why: String,
        /// What to do.
        help: String,
    },
    /// Nothing to resume or show there.
    #[error("{dir} {why}", dir = .dir.display())]
    NoRun {
        /// The directory.
        dir: PathBuf,
        /// What is wrong ("does not exist", "holds no run (no journal.jsonl)").
        why: String,
    },
    /// An I/O error, with the path it is about.
    #[error("{path}: {source}", path = .path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl RunDirError {
    /// The exit status `orchestrate` gives for this error: 2 for a wrong argument (the user
    /// named the wrong directory), 4 for a directory that cannot be used now.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunDirError::NotARunDir { .. }
            | RunDirError::NotADirectory { .. }
            | RunDirError::HoldsRun { .. }
            | RunDirError::NoRun { .. } => crate::exit::INVALID_INPUT,
            RunDirError::InUse { .. } | RunDirError::Io { .. } => crate::exit::RUN_ERROR,
        }
    }
}

/// Attaches `path` to an I/O error.
pub(crate) fn io_at(path: &Path) -> impl FnOnce(io::Error) -> RunDirError + '_ {
    move |source| RunDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Who owns a run directory, as its lock file says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockOwner {
    /// PID of the owning `orchestrate`.
    pub pid: u32,
    /// Host it runs on.
    #[serde(default)]
    pub host: String,
    /// When it took the directory (Unix seconds).
    #[serde(default)]
    pub since_unix: u64,
}

impl std::fmt::Display for LockOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "orchestrate pid {}", self.pid)?;
        if !self.host.is_empty() {
            write!(f, " on {}", self.host)?;
        }
        Ok(())
    }
}

/// A run directory on disk, owned by this process for as long as any clone of it lives.
#[derive(Debug, Clone)]
pub struct RunDir {
    root: PathBuf,
    _lock: Arc<File>,
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Whether `root` has any entry besides what a run killed while setting up leaves: its lock
/// file and the temporary files of its atomic writes (`.NAME.tmp-PID`).
fn has_entries(root: &Path) -> Result<bool, RunDirError> {
    let entries = fs::read_dir(root).map_err(io_at(root))?;
    for entry in entries {
        let entry = entry.map_err(io_at(root))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let leftover = name == LOCK_FILE || (name.starts_with('.') && name.contains(".tmp-"));
        if !leftover {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Takes the exclusive lock of `root`, or says who holds it.
fn lock(root: &Path) -> Result<File, RunDirError> {
    let path = root.join(LOCK_FILE);
    let (mut file, locked) =
        crate::store::file_lock::open_and_try_lock(&path).map_err(io_at(&path))?;
    if !locked {
        let owner = read_owner(&path).unwrap_or(LockOwner {
            pid: 0,
            host: String::new(),
            since_unix: 0,
        });
        return Err(RunDirError::InUse {
            dir: root.to_path_buf(),
            owner,
        });
    }
    let owner = LockOwner {
        pid: std::process::id(),
        host: host_name(),
        since_unix: crate::timefmt::unix_ms() / 1000,
    };
    let mut bytes = serde_json::to_vec(&owner)
        .map_err(io::Error::other)
        .map_err(io_at(&path))?;
    bytes.push(b'\n');
    file.set_len(0).map_err(io_at(&path))?;
    file.write_all(&bytes).map_err(io_at(&path))?;
    Ok(file)
}

fn read_owner(path: &Path) -> Option<LockOwner> {
    // The owner writes its pid just after taking the lock: give it a moment.
    for _ in 0..20 {
        let mut text = String::new();
        if File::open(path)
            .and_then(|mut f| f.read_to_string(&mut text))
            .is_ok()
        {
            if let Ok(owner) = serde_json::from_str(text.trim()) {
                return Some(owner);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    None
}

/// The live owner of the run in `root`, if a process holds its lock now.
pub fn live_owner(root: &Path) -> Option<LockOwner> {
    let path = root.join(LOCK_FILE);
    let file = File::open(&path).ok()?;
    // SAFETY: flock(2) on a descriptor this function owns; a shared lock taken is dropped with
    // the file at the end of this function.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if rc == 0 {
        return None;
    }
    Some(read_owner(&path).unwrap_or(LockOwner {
        pid: 0,
        host: String::new(),
        since_unix: 0,
    }))
}

/// Creates `dir` (and its parents) for a new run; its canonical path. A path that cannot be
/// a directory is refused as [`RunDirError::NotADirectory`] (a wrong argument), saying what is
/// there and what to do, before anything is created.
fn make_dir(dir: &Path) -> Result<PathBuf, RunDirError> {
    if let Some((why, help)) = not_a_directory(dir) {
        return Err(RunDirError::NotADirectory {
            dir: dir.to_path_buf(),
            why,
            help,
        });
    }
    match fs::create_dir_all(dir) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            let parent = dir
                .ancestors()
                .skip(1)
                .find(|a| fs::metadata(a).is_ok())
                .map_or_else(|| "one of its parents".into(), |a| a.display().to_string());
            return Err(RunDirError::NotADirectory {
                dir: dir.to_path_buf(),
                why: format!("cannot be created: {parent} is a file, not a directory"),
                help: "choose a --run-dir whose parents are directories".into(),
            });
        }
        other => other.map_err(io_at(dir))?,
    }
    fs::canonicalize(dir).map_err(io_at(dir))
}

/// Why `dir` cannot be made a run directory, and what to do, when something that is not a
/// directory is there: a file of any kind, or a symbolic link to nothing or to a file. `None`
/// for a directory (or a link to one) and for a path where nothing is.
fn not_a_directory(dir: &Path) -> Option<(String, String)> {
    let here = fs::symlink_metadata(dir).ok()?;
    let choose = "choose a new or empty directory for --run-dir";
    if !here.file_type().is_symlink() {
        let kind = crate::store::user_file::non_regular_kind(&here).unwrap_or("a regular file");
        return (!here.is_dir()).then(|| {
            (
                format!("is {kind}, not a directory"),
                format!("--run-dir names the directory a run writes into; {choose} (or remove the file)"),
            )
        });
    }
    let target = fs::read_link(dir)
        .map(|t| t.display().to_string())
        .unwrap_or_else(|_| "somewhere unreadable".into());
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => None,
        Ok(meta) => Some((
            format!(
                "is a symbolic link to {target}, which is {}, not a directory",
                crate::store::user_file::non_regular_kind(&meta).unwrap_or("a regular file")
            ),
            format!("{choose} (or point the link at a directory)"),
        )),
        Err(e) if e.kind() != io::ErrorKind::NotFound => Some((
            format!("is a symbolic link to {target}, which cannot be followed ({e})"),
            format!("{choose} (or point the link at a directory)"),
        )),
        Err(_) => Some((
            format!("is a symbolic link to {target}, which does not exist"),
            format!("create the directory it points to, or {choose} (a run directory is not created through a broken link)"),
        )),
    }
}

impl RunDir {
    /// Creates `dir` (and parents) for a new run and takes it. Refuses a directory that holds
    /// a run (live: [`RunDirError::InUse`]; else [`RunDirError::HoldsRun`]) and a non-empty
    /// directory that is not a run directory; an empty existing directory is fine.
    pub fn create(dir: &Path) -> Result<RunDir, RunDirError> {
        let root = make_dir(dir)?;
        let check = |root: &Path| -> Result<(), RunDirError> {
            if root.join(JOURNAL_FILE).is_file() {
                if let Some(owner) = live_owner(root) {
                    return Err(RunDirError::InUse {
                        dir: root.to_path_buf(),
                        owner,
                    });
                }
                return Err(RunDirError::HoldsRun {
                    dir: root.to_path_buf(),
                });
            }
            // A run killed while setting up (before its journal existed) left at most its
            // lock, run.json and plan copy: nothing ran, the directory is reused.
            if !root.join(META_FILE).is_file() && has_entries(root)? {
                return Err(RunDirError::NotARunDir {
                    dir: root.to_path_buf(),
                });
            }
            Ok(())
        };
        check(&root)?;
        let lock = lock(&root)?;
        // Someone may have started a run here between the check and the lock.
        check(&root)?;
        Ok(RunDir {
            root,
            _lock: Arc::new(lock),
        })
    }

    /// Opens and takes the directory of an earlier run, to resume it: it must hold a journal
    /// and no live process may own it.
    pub fn open_existing(dir: &Path) -> Result<RunDir, RunDirError> {
        let root = existing_run(dir)?;
        let lock = lock(&root)?;
        Ok(RunDir {
            root,
            _lock: Arc::new(lock),
        })
    }

    /// A fresh directory under `parent` named `<name>-<UTC stamp>`, with a suffix if taken.
    pub fn create_fresh(parent: &Path, name: &str) -> Result<RunDir, RunDirError> {
        RunDir::create_fresh_avoiding(parent, name, |_| false)
    }

    /// [`RunDir::create_fresh`], skipping the names `taken` says are in use elsewhere (the
    /// daemon's run ids, whose directories may have gone from `parent`).
    pub(crate) fn create_fresh_avoiding(
        parent: &Path,
        name: &str,
        taken: impl Fn(&str) -> bool,
    ) -> Result<RunDir, RunDirError> {
        let stamp = crate::timefmt::compact_stamp(crate::timefmt::unix_ms() / 1000);
        fs::create_dir_all(parent).map_err(io_at(parent))?;
        for n in 0..1000 {
            let leaf = if n == 0 {
                format!("{name}-{stamp}")
            } else {
                format!("{name}-{stamp}-{n}")
            };
            if taken(&leaf) {
                continue;
            }
            let candidate = parent.join(leaf);
            match fs::create_dir(&candidate) {
                Ok(()) => return RunDir::create(&candidate),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(RunDirError::Io {
                        path: candidate,
                        source: e,
                    })
                }
            }
        }
        Err(RunDirError::Io {
            path: parent.to_path_buf(),
            source: io::Error::other("could not find a free run directory name"),
        })
    }

    /// The absolute root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The journal file.
    pub(crate) fn journal_path(&self) -> PathBuf {
        self.root.join(JOURNAL_FILE)
    }

    /// The report file.
    pub(crate) fn report_path(&self) -> PathBuf {
        self.root.join("report.json")
    }

    /// Stage `name`'s directory (logs, spec, events).
    pub(crate) fn stage_dir(&self, name: &str) -> PathBuf {
        self.stage_path(name, None)
    }

    /// Stage `name`'s output directory: what downstream stages receive.
    pub(crate) fn output_dir(&self, name: &str) -> PathBuf {
        self.stage_path(name, Some("output"))
    }

    /// `<root>/stages/<name>[/<below>]`, built in one allocation (a report of a sweep asks
    /// for every stage's).
    fn stage_path(&self, name: &str, below: Option<&str>) -> PathBuf {
        let root = self.root.as_os_str();
        let mut path = std::ffi::OsString::with_capacity(
            root.len() + "/stages/".len() + name.len() + below.map_or(0, |b| b.len() + 1),
        );
        path.push(root);
        let mut path = PathBuf::from(path);
        path.push("stages");
        path.push(name);
        if let Some(below) = below {
            path.push(below);
        }
        path
    }

    /// Creates a stage's directory and its output directory inside it (what exists is kept);
    /// returns whether the output directory was created just now (and so is empty).
    pub(crate) fn prepare_stage_dirs(stage_dir: &Path, output_dir: &Path) -> io::Result<bool> {
        match fs::create_dir(stage_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir_all(stage_dir)?,
            Err(e) => return Err(e),
        }
        match fs::create_dir(output_dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Records the plan the run uses, in its own format, and `run.json` with the directory
    /// its relative paths mean; a plan copy of the other format left by an earlier start of
    /// the run is removed.
    pub(crate) fn record_plan(
        &self,
        source: &str,
        format: PlanFormat,
        source_name: &str,
        base_dir: &Path,
    ) -> Result<(), RunDirError> {
        // run.json first: a directory holding it is recognised as this run's even if the
        // process dies before anything else is written.
        let meta = RunMeta {
            v: protocol::PROTOCOL_VERSION,
            plan_format: format,
            plan_source: source_name.to_string(),
            base_dir: base_dir.display().to_string(),
            orchestrate_version: env!("CARGO_PKG_VERSION").to_string(),
        };
        let path = self.root.join(META_FILE);
        let mut bytes = serde_json::to_vec_pretty(&meta)
            .map_err(io::Error::other)
            .map_err(io_at(&path))?;
        bytes.push(b'\n');
        write_atomic(&path, &bytes).map_err(io_at(&path))?;
        let plan_path = self.root.join(format.file_name());
        write_atomic(&plan_path, source.as_bytes()).map_err(io_at(&plan_path))?;
        for other in [PlanFormat::Toml, PlanFormat::Json] {
            if other != format {
                let stale = self.root.join(other.file_name());
                if stale.exists() {
                    fs::remove_file(&stale).map_err(io_at(&stale))?;
                }
            }
        }
        Ok(())
    }

    /// `path` relative to the run directory when it lies inside it (else unchanged): what the
    /// journal records, so that the directory can move.
    pub fn relative(&self, path: &Path) -> PathBuf {
        path.strip_prefix(&self.root)
            .map(Path::to_path_buf)
            .unwrap_or_else(|_| path.to_path_buf())
    }
}

/// The canonical root of the existing run directory `dir`, or why it is not one.
pub fn existing_run(dir: &Path) -> Result<PathBuf, RunDirError> {
    if !dir.exists() {
        return Err(RunDirError::NoRun {
            dir: dir.to_path_buf(),
            why: "does not exist".into(),
        });
    }
    let root = fs::canonicalize(dir).map_err(io_at(dir))?;
    if !root.is_dir() {
        return Err(RunDirError::NoRun {
            dir: root,
            why: "is not a directory".into(),
        });
    }
    if !root.join(JOURNAL_FILE).is_file() {
        return Err(RunDirError::NoRun {
            dir: root,
            why: "holds no run (no journal.jsonl)".into(),
        });
    }
    Ok(root)
}

/// Where the plan copy of the run in `root` is, its format and the base directory its
/// relative paths mean. Runs written before `run.json` existed: `plan.toml`, based at `root`.
pub fn run_plan_location(root: &Path) -> Result<(PathBuf, PlanFormat, PathBuf), RunDirError> {
    let meta_path = root.join(META_FILE);
    match fs::read_to_string(&meta_path) {
        Ok(text) => {
            let meta: RunMeta = serde_json::from_str(&text).map_err(|e| RunDirError::Io {
                path: meta_path.clone(),
                source: io::Error::new(io::ErrorKind::InvalidData, e),
            })?;
            Ok((
                root.join(meta.plan_format.file_name()),
                meta.plan_format,
                PathBuf::from(meta.base_dir),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok((
            root.join(PlanFormat::Toml.file_name()),
            PlanFormat::Toml,
            root.to_path_buf(),
        )),
        Err(e) => Err(RunDirError::Io {
            path: meta_path,
            source: e,
        }),
    }
}

/// Writes `bytes` to `path` so that readers see the old content or the new, never a mix (a
/// temporary file beside it, renamed over it), without waiting for the disk: for files the
/// journal can rebuild (`report.json`, `plan.resolved.json`, results), which a crash may leave
/// at their previous version. On failure the temporary file is removed.
pub(crate) fn write_replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace(path, |file| file.write_all(bytes), false)
}

/// The buffer [`write_replace_with`] streams a file through. A concrete type, not a
/// `dyn Write`: a serializer's many small writes (a pretty-printed report is mostly
/// punctuation and indentation) then compile to copies into the buffer, not to a call each.
pub(crate) type ReplaceBuffer<'f> = io::BufWriter<&'f mut File>;

/// [`write_replace`] of what `fill` writes, streamed through a buffer: a large file (the
/// report of a 100,000-stage sweep) is never held in memory whole.
pub(crate) fn write_replace_with(
    path: &Path,
    fill: impl FnOnce(&mut ReplaceBuffer<'_>) -> io::Result<()>,
) -> io::Result<()> {
    replace(
        path,
        |file| {
            let mut out = io::BufWriter::with_capacity(256 << 10, file);
            fill(&mut out)?;
            out.flush()
        },
        false,
    )
}

/// [`write_replace_with`] of `value` as pretty JSON and a newline.
pub(crate) fn write_json_replace(path: &Path, value: &impl serde::Serialize) -> io::Result<()> {
    write_replace_with(path, |out| {
        serde_json::to_writer_pretty(&mut *out, value).map_err(io::Error::other)?;
        out.write_all(b"\n")
    })
}

/// Writes `bytes` to `path` so that readers see the old content or the new, never a mix,
/// durably: a temporary file beside it, fsync, rename, fsync of the directory. On failure
/// the temporary file is removed and the old content stays.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace(path, |file| file.write_all(bytes), true)
}

fn replace(
    path: &Path,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
    durable: bool,
) -> io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let written = (|| {
        let mut file = File::create(&tmp)?;
        fill(&mut file)?;
        if durable {
            file.sync_all()?;
        }
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if durable {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory path of the test's own that does not exist yet (the scratch parent does).
    fn scratch(name: &str) -> (crate::testutil::Scratch, PathBuf) {
        let parent = crate::testutil::scratch(&format!("rundir-{name}"));
        let dir = parent.join("run");
        (parent, dir)
    }

    #[test]
    fn one_owner_at_a_time_and_the_lock_tells_live_from_dead() {
        let (_scratch, dir) = scratch("lock");
        let first = RunDir::create(&dir).unwrap();
        fs::write(first.journal_path(), b"").unwrap();
        let owner = live_owner(first.root()).expect("a live owner");
        assert_eq!(owner.pid, std::process::id());
        match RunDir::open_existing(&dir) {
            Err(RunDirError::InUse { owner, .. }) => assert_eq!(owner.pid, std::process::id()),
            other => panic!("expected InUse, got {other:?}"),
        }
        match RunDir::create(&dir) {
            Err(RunDirError::InUse { .. }) => {}
            other => panic!("expected InUse, got {other:?}"),
        }
        drop(first);
        assert_eq!(live_owner(&dir), None, "released when the owner goes");
        let again = RunDir::open_existing(&dir).expect("resumable once released");
        drop(again);
        match RunDir::create(&dir) {
            Err(RunDirError::HoldsRun { .. }) => {}
            other => panic!("expected HoldsRun, got {other:?}"),
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_non_empty_directory_that_is_not_a_run_is_refused_untouched() {
        let (_scratch, dir) = scratch("foreign");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("plan.toml"), b"mine").unwrap();
        match RunDir::create(&dir) {
            Err(e @ RunDirError::NotARunDir { .. }) => assert_eq!(e.exit_code(), 2),
            other => panic!("expected NotARunDir, got {other:?}"),
        }
        assert_eq!(fs::read(dir.join("plan.toml")).unwrap(), b"mine");
        assert!(!dir.join(LOCK_FILE).exists(), "nothing written");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn write_atomic_leaves_no_temp_file_on_failure() {
        let (_scratch, dir) = scratch("atomic");
        fs::create_dir_all(dir.join("target-is-a-dir")).unwrap();
        fs::write(dir.join("target-is-a-dir/x"), b"x").unwrap();
        assert!(write_atomic(&dir.join("target-is-a-dir"), b"new").is_err());
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("target-is-a-dir")]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
