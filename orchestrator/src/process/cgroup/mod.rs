//! A cgroup (v2) per stage: its processes are placed in it before they run, found through
//! its membership, ended with one write to `cgroup.kill`, held to the plan's `memory`, `pids`
//! and `cpus`, and judged by the kernel's own counters (`memory.events`' `oom_kill`,
//! `memory.peak`).
//!
//! Layout: `<this process's cgroup>/orchestrate-<pid>-<run>/<n>-<stage>`. The run's cgroup
//! holds no process (cgroup v2's rule for a group whose children use controllers) and enables
//! the controllers its stages' limits need; a stage's cgroup is removed once empty, the run's
//! when the run ends. In a run that enables no controller (no stage sets a limit) an empty
//! stage cgroup holds no counter and no limit, and is kept for the next stage instead
//! ([`RunCgroup::stage`]): a sweep of short stages is spared a `mkdir` and an `rmdir` each.
//!
//! - [`host`]: what the host offers (read only);
//! - [`policy`]: whether a stage's limits are enforced, refused or left to Slurm;
//! - [`namespace`]: whether each stage gets a cgroup namespace of its own here.
//!
//! Where cgroup v2 cannot be used, stages keep the process-group mechanism of
//! [`crate::process::tree`], and asking for a limit is refused at preflight.

pub mod host;
pub mod namespace;
pub mod policy;

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A stage's host limits, from its plan keys.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    /// `memory.max`, bytes.
    pub memory: Option<u64>,
    /// `pids.max`.
    pub pids: Option<u64>,
    /// `cpu.max`, in CPUs.
    pub cpus: Option<f64>,
}

/// The period of `cpu.max`, microseconds (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;

impl Limits {
    /// The limits `stage` asks for.
    pub fn of(stage: &protocol::plan::Stage) -> Limits {
        Limits {
            memory: stage.memory.map(|m| m.0),
            pids: stage.pids,
            cpus: stage.cpus,
        }
    }

    /// Each limit asked for: its plan key and the controller it needs.
    pub fn requested(&self) -> Vec<(&'static str, &'static str)> {
        let mut keys = Vec::new();
        if self.memory.is_some() {
            keys.push(("memory", "memory"));
        }
        if self.pids.is_some() {
            keys.push(("pids", "pids"));
        }
        if self.cpus.is_some() {
            keys.push(("cpus", "cpu"));
        }
        keys
    }

    /// The files to write and their content.
    fn files(&self) -> Vec<(&'static str, String)> {
        let mut files = Vec::new();
        if let Some(bytes) = self.memory {
            files.push(("memory.max", bytes.to_string()));
            // No swap past the limit: a stage over its memory is ended, not paged out.
            files.push(("memory.swap.max", "0".into()));
        }
        if let Some(pids) = self.pids {
            files.push(("pids.max", pids.to_string()));
        }
        if let Some(cpus) = self.cpus {
            let quota = ((cpus * CPU_PERIOD_US as f64).round() as u64).max(1_000);
            files.push(("cpu.max", format!("{quota} {CPU_PERIOD_US}")));
        }
        files
    }
}

/// The run's cgroup, parent of its stages'. Removed when dropped (once its stages' are).
#[derive(Debug)]
pub struct RunCgroup {
    dir: PathBuf,
    /// Controllers enabled for the stages.
    controllers: Vec<String>,
    /// Numbers the stages' cgroups (a stage's name may be long, or repeat over attempts).
    next: AtomicU64,
    /// Empty stage cgroups kept for reuse (only when `controllers` is empty).
    idle: Arc<Mutex<Vec<Idle>>>,
    /// Whether the stages' processes enter a cgroup namespace rooted at their cgroup
    /// (see [`namespace`]).
    namespaced: bool,
}

/// An empty stage cgroup kept for the next stage, with its files still open: a sweep of short
/// stages is spared two `open`s and two `close`s each.
#[derive(Debug)]
struct Idle {
    dir: PathBuf,
    procs: Option<Arc<File>>,
    dir_fd: Option<Arc<File>>,
    watched: Arc<Watched>,
}

/// A stage cgroup's `cgroup.events`, opened at its first read and kept open with the cgroup
/// (a reused one keeps it for its next stage): each read after the first is one `pread` from
/// offset 0, which has the kernel write the file anew, where opening it takes three system
/// calls (a sweep reads it at every stage's end).
#[derive(Debug, Default)]
struct Watched {
    events: std::sync::OnceLock<File>,
}

impl Watched {
    /// The text of `dir/name` through the file kept in `slot`; `None` when it cannot be read.
    fn read(slot: &std::sync::OnceLock<File>, dir: &Path, name: &str) -> Option<String> {
        let file = match slot.get() {
            Some(file) => file,
            None => {
                let file = File::open(dir.join(name)).ok()?;
                slot.get_or_init(|| file)
            }
        };
        crate::process::kernel_file::read_again(file)
    }
}

impl RunCgroup {
    /// Makes `<parent>/<name>` and enables `controllers` for its children; `namespaced`: its
    /// stages' processes enter a cgroup namespace rooted at their cgroup
    /// ([`StageCgroup::namespaced`]).
    pub fn create(
        parent: &Path,
        name: &str,
        controllers: &[&str],
        namespaced: bool,
    ) -> io::Result<RunCgroup> {
        let dir = parent.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(context(e, "cannot create cgroup", &dir)),
        }
        let run = RunCgroup {
            dir,
            controllers: controllers.iter().map(|c| c.to_string()).collect(),
            next: AtomicU64::new(1),
            idle: Arc::default(),
            namespaced,
        };
        if !controllers.is_empty() {
            let line: Vec<String> = controllers.iter().map(|c| format!("+{c}")).collect();
            write_file(&run.dir.join("cgroup.subtree_control"), &line.join(" "))?;
        }
        Ok(run)
    }

    /// Its directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Makes the cgroup of one attempt of stage `name`, with `limits` written before any
    /// process is in it.
    ///
    /// Where the run enables no controller, an idle one is reused (named `stage-N`, not after
    /// the stage), and the cgroup goes back to the idle ones once empty.
    pub fn stage(&self, name: &str, limits: &Limits) -> io::Result<StageCgroup> {
        if self.controllers.is_empty() && limits.requested().is_empty() {
            return self.reusable();
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let safe: String = name
            .chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
                _ => '_',
            })
            .take(64)
            .collect();
        let dir = self.dir.join(format!("{n}-{safe}"));
        std::fs::create_dir(&dir).map_err(|e| context(e, "cannot create cgroup", &dir))?;
        // Removed again (when dropped) if a step below fails.
        let mut made = StageCgroup {
            procs: None,
            dir_fd: None,
            memory: self.controllers.iter().any(|c| c == "memory"),
            pids: self.controllers.iter().any(|c| c == "pids"),
            limit: limits.memory,
            namespaced: self.namespaced,
            dir,
            idle: None,
            watched: Arc::default(),
            done: AtomicBool::new(false),
            killed: AtomicBool::new(false),
            empty: AtomicBool::new(false),
        };
        for (file, value) in limits.files() {
            let path = made.dir.join(file);
            // Without swap accounting there is no memory.swap.max: nothing to hold back.
            if file == "memory.swap.max" && !path.exists() {
                continue;
            }
            write_file(&path, &value)?;
        }
        let procs = OpenOptions::new()
            .write(true)
            .open(made.dir.join("cgroup.procs"))
            .map_err(|e| context(e, "cannot open", &made.dir.join("cgroup.procs")))?;
        made.procs = Some(Arc::new(procs));
        made.dir_fd = File::open(&made.dir).ok().map(Arc::new);
        Ok(made)
    }

    /// An idle stage cgroup, or a new one, that returns to the idle ones once empty.
    fn reusable(&self) -> io::Result<StageCgroup> {
        let kept = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let Idle {
            dir,
            procs,
            dir_fd,
            watched,
        } = match kept {
            Some(idle) => idle,
            None => {
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                let dir = self.dir.join(format!("stage-{n}"));
                std::fs::create_dir(&dir).map_err(|e| context(e, "cannot create cgroup", &dir))?;
                Idle {
                    dir,
                    procs: None,
                    dir_fd: None,
                    watched: Arc::default(),
                }
            }
        };
        let mut made = StageCgroup {
            procs,
            dir_fd,
            memory: false,
            pids: false,
            limit: None,
            namespaced: self.namespaced,
            dir,
            idle: Some(self.idle.clone()),
            watched,
            done: AtomicBool::new(false),
            killed: AtomicBool::new(false),
            empty: AtomicBool::new(false),
        };
        if made.procs.is_none() {
            let procs_path = made.dir.join("cgroup.procs");
            made.procs = Some(Arc::new(
                OpenOptions::new()
                    .write(true)
                    .open(&procs_path)
                    .map_err(|e| context(e, "cannot open", &procs_path))?,
            ));
        }
        if made.dir_fd.is_none() {
            made.dir_fd = File::open(&made.dir).ok().map(Arc::new);
        }
        Ok(made)
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        for dir in self
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = remove_tree(&dir.dir);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One attempt's cgroup. Removed when dropped, if empty by then.
#[derive(Debug)]
pub struct StageCgroup {
    dir: PathBuf,
    /// `cgroup.procs`, open for writing: a child writes `0` to it to move itself in.
    /// (Shared: a reused cgroup keeps its files open for the next stage.)
    procs: Option<Arc<File>>,
    /// The directory, open: `clone3` creates a child in it (`CLONE_INTO_CGROUP`).
    dir_fd: Option<Arc<File>>,
    /// Whether the memory controller is on (then `memory.*` files exist).
    memory: bool,
    /// Whether the pids controller is on (then `pids.*` files exist).
    pids: bool,
    /// `memory.max`, if set.
    limit: Option<u64>,
    /// Its processes enter a cgroup namespace rooted at it.
    namespaced: bool,
    /// Where it goes back to once empty, when it is a reusable one.
    idle: Option<Arc<Mutex<Vec<Idle>>>>,
    /// Its `cgroup.events`, kept open.
    watched: Arc<Watched>,
    /// Removed (or given back) already.
    done: AtomicBool,
    /// A kill was written to it: it is removed, never given back (see [`StageCgroup::remove`]).
    killed: AtomicBool,
    /// Seen empty by the stage's end ([`StageCgroup::seen_empty`]): removed when dropped
    /// without reading `cgroup.events` again.
    empty: AtomicBool,
}

/// What a stage's cgroup counted, read once its processes are gone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    /// Processes the kernel's OOM killer ended in it (`memory.events` `oom_kill`).
    pub oom_kills: Option<u64>,
    /// Its highest memory use (`memory.peak`, Linux 5.19), bytes. (`oom_kills` is set
    /// whenever the memory controller is on.)
    pub memory_peak: Option<u64>,
    /// Its `memory.max`, if set.
    pub memory_limit: Option<u64>,
    /// Times `pids.max` refused a fork (`pids.events` `max`).
    pub pids_refused: Option<u64>,
}

impl StageCgroup {
    /// Its directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// `cgroup.procs`, open for writing: writing `0` to it moves the writer in.
    pub fn procs_fd(&self) -> Option<BorrowedFd<'_>> {
        self.procs.as_ref().map(|f| f.as_fd())
    }

    /// The directory, open for `CLONE_INTO_CGROUP`.
    pub fn dir_fd(&self) -> Option<BorrowedFd<'_>> {
        self.dir_fd.as_ref().map(|f| f.as_fd())
    }

    /// Whether the stage's processes enter a cgroup namespace rooted at this cgroup once in
    /// it (see [`namespace`]).
    pub fn namespaced(&self) -> bool {
        self.namespaced
    }

    /// Whether this handle gave its cgroup up ([`StageCgroup::remove`]): a reusable cgroup may
    /// then be another stage's, so nothing through this handle looks into it or kills in it.
    fn given_up(&self) -> bool {
        self.done.load(Ordering::Relaxed)
    }

    /// Every live process in it or in a cgroup below it (zombies left out); none once the
    /// cgroup was given up.
    pub fn members(&self) -> Vec<i32> {
        if self.given_up() {
            return Vec::new();
        }
        let mut pids = Vec::new();
        collect_members(&self.dir, &mut pids);
        pids.retain(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|t| crate::process::scan::parse_stat(&t))
                .is_some_and(|s| s.state != 'Z')
        });
        pids
    }

    /// Whether any process is in it (`cgroup.events`' `populated`); false once it was given up.
    pub fn populated(&self) -> bool {
        if self.given_up() {
            return false;
        }
        // At every stage's end: one `pread` (see `Watched`).
        match Watched::read(&self.watched.events, &self.dir, "cgroup.events") {
            Some(events) => counter(&events, "populated") != Some(0),
            None => !self.members().is_empty(),
        }
    }

    /// SIGKILLs every process in it and below at once (`cgroup.kill`, Linux 5.14); one by
    /// one where the kernel has no `cgroup.kill`. Nothing once the cgroup was given up: a late
    /// kill of a stage that is gone must not reach the stage that reuses its cgroup.
    pub fn kill(&self) {
        if self.given_up() {
            return;
        }
        self.killed.store(true, Ordering::Relaxed);
        if write_file(&self.dir.join("cgroup.kill"), "1").is_err() {
            for pid in self.members() {
                // SAFETY: sending a signal has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }

    /// The memory its processes use now (`memory.current`), when the memory controller is on.
    pub fn memory_current(&self) -> Option<u64> {
        if !self.memory {
            return None;
        }
        read_number(&self.dir.join("memory.current"))
    }

    /// Its counters (see [`CgroupUsage`]).
    pub fn usage(&self) -> CgroupUsage {
        let events = |file: &str, key: &str| {
            std::fs::read_to_string(self.dir.join(file))
                .ok()
                .and_then(|text| counter(&text, key))
        };
        CgroupUsage {
            oom_kills: self
                .memory
                .then(|| events("memory.events", "oom_kill"))
                .flatten(),
            memory_peak: self
                .memory
                .then(|| read_number(&self.dir.join("memory.peak")))
                .flatten(),
            memory_limit: self.limit,
            pids_refused: self.pids.then(|| events("pids.events", "max")).flatten(),
        }
    }

    /// Removes it, and any cgroup a stage made below it; fails while a process is in one.
    /// A reusable one (see [`RunCgroup::stage`]) that is empty goes back to the idle ones
    /// instead, unless a kill was written to it: on Linux 6.18 a process started in a cgroup
    /// reused soon after its `cgroup.kill` was SIGKILLed as it started (seen with an early
    /// start stopped at once, then its upstream's retry), so a killed cgroup is made afresh.
    pub fn remove(&self) -> io::Result<()> {
        self.remove_checked(false)
    }

    /// Said by a caller that has just seen it empty (`cgroup.events` said unpopulated and
    /// nothing of the stage is left anywhere to move back in): it is removed, or given back
    /// for reuse, when this handle is dropped, without reading `cgroup.events` again. A
    /// stage's end so leaves that work (a look for cgroups below a reusable one, an
    /// `rmdir` otherwise) until after it has spawned the successor it hands over to.
    pub fn seen_empty(&self) {
        self.empty.store(true, Ordering::Relaxed);
    }

    fn remove_checked(&self, seen_empty: bool) -> io::Result<()> {
        if self.done.load(Ordering::Relaxed) {
            return Ok(());
        }
        if let Some(idle) = self
            .idle
            .as_ref()
            .filter(|_| !self.killed.load(Ordering::Relaxed))
        {
            if (seen_empty || !self.populated()) && self.no_subgroups() {
                self.done.store(true, Ordering::Relaxed);
                idle.lock().unwrap_or_else(|e| e.into_inner()).push(Idle {
                    dir: self.dir.clone(),
                    procs: self.procs.clone(),
                    dir_fd: self.dir_fd.clone(),
                    watched: self.watched.clone(),
                });
                return Ok(());
            }
        }
        remove_tree(&self.dir)?;
        self.done.store(true, Ordering::Relaxed);
        Ok(())
    }
}

impl StageCgroup {
    /// Whether no cgroup is below it: its directory's link count, which the kernel keeps at
    /// two plus its subdirectories (one `statx` of the directory it holds open, where
    /// `cgroup.stat` has the kernel format six counters at every stage's end), else its
    /// listing.
    fn no_subgroups(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        match self.dir_fd.as_ref().and_then(|dir| dir.metadata().ok()) {
            Some(meta) => meta.nlink() == 2,
            None => subgroups(&self.dir).is_empty(),
        }
    }
}

impl Drop for StageCgroup {
    fn drop(&mut self) {
        let seen_empty = self.empty.load(Ordering::Relaxed);
        if let Err(e) = self.remove_checked(seen_empty) {
            if seen_empty {
                tracing::warn!("{e}");
            }
        }
    }
}

/// The pids of `dir`'s `cgroup.procs` and of every cgroup below it.
fn collect_members(dir: &Path, pids: &mut Vec<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    for sub in subgroups(dir) {
        collect_members(&sub, pids);
    }
}

fn subgroups(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes `dir` and the cgroups below it (looked for only when `dir` will not go alone).
fn remove_tree(dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(_) => {}
    }
    for sub in subgroups(dir) {
        remove_tree(&sub)?;
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other.map_err(|e| context(e, "cannot remove cgroup", dir)),
    }
}

/// Removes the run cgroups in `parent` left by an `orchestrate` that is gone
/// (`orchestrate-<pid>-…` of a pid that no longer exists), where they are empty.
pub fn sweep_stale(parent: &Path) {
    for dir in subgroups(parent) {
        let Some(pid) = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("orchestrate-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = remove_tree(&dir);
        }
    }
}

/// The value of `key` in a flat-keyed file (`memory.events`, `cgroup.events`).
pub fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|e| context(e, &format!("cannot write `{value}` to"), path))
}

fn context(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run cgroup under this process's own, where the host allows one (CI's does: it must).
    fn run_cgroup(name: &str) -> Option<RunCgroup> {
        let host = host::HostCgroups::detect(&crate::settings::Settings::from_env());
        let Some(own) = host.own.clone().filter(|_| host.usable()) else {
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "no cgroup v2: {host:?}"
            );
            return None;
        };
        let name = format!("orchestrate-{}-unit-{name}", std::process::id());
        Some(RunCgroup::create(&own, &name, &[], false).unwrap())
    }

    #[test]
    fn a_stage_cgroup_lists_its_members_kills_them_at_once_and_goes_back_to_the_run() {
        let Some(run) = run_cgroup("kill") else {
            return;
        };
        let stage = run.stage("a", &Limits::default()).unwrap();
        let mut children: Vec<_> = (0..3)
            .map(|_| {
                std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in &children {
            std::fs::write(stage.path().join("cgroup.procs"), child.id().to_string()).unwrap();
        }
        let mut members = stage.members();
        members.sort();
        let mut pids: Vec<i32> = children.iter().map(|c| c.id() as i32).collect();
        pids.sort();
        assert_eq!(members, pids);
        assert!(stage.populated());
        stage.kill();
        for child in &mut children {
            let status = child.wait().unwrap();
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(9)
            );
        }
        assert!(!stage.populated() && stage.members().is_empty());
        // Killed: removed, not kept for another stage.
        let killed = stage.path().to_path_buf();
        stage.remove().unwrap();
        assert!(!killed.exists(), "a killed cgroup is not reused");
        // Empty and never killed, in a run without limits: kept for the next stage, which
        // gets the same one.
        let quiet = run.stage("q", &Limits::default()).unwrap();
        let dir = quiet.path().to_path_buf();
        quiet.remove().unwrap();
        assert!(dir.is_dir());
        let again = run.stage("b", &Limits::default()).unwrap();
        assert_eq!(again.path(), dir);
        // One in use is nobody else's.
        let other = run.stage("c", &Limits::default()).unwrap();
        assert_ne!(other.path(), dir);
        drop((again, other));
        let run_dir = run.path().to_path_buf();
        drop(run);
        assert!(
            !run_dir.exists(),
            "the run's cgroup and its idle ones are removed"
        );
    }

    #[test]
    fn a_reused_cgroup_that_a_stage_made_a_cgroup_in_is_removed_not_reused_again() {
        let Some(run) = run_cgroup("subgroup") else {
            return;
        };
        // Read through the files kept open: once with no cgroup below, once with one.
        let first = run.stage("a", &Limits::default()).unwrap();
        let dir = first.path().to_path_buf();
        first.remove().unwrap();
        assert!(dir.is_dir(), "an empty cgroup is kept for the next stage");
        let second = run.stage("b", &Limits::default()).unwrap();
        assert_eq!(second.path(), dir);
        std::fs::create_dir(dir.join("made-by-the-stage")).unwrap();
        second.remove().unwrap();
        assert!(
            !dir.exists(),
            "a cgroup with one below it is removed, not reused"
        );
        let third = run.stage("c", &Limits::default()).unwrap();
        assert_ne!(third.path(), dir);
    }

    #[test]
    fn a_late_kill_through_a_stage_that_gave_its_cgroup_up_spares_the_stage_that_reuses_it() {
        let Some(run) = run_cgroup("late-kill") else {
            return;
        };
        let gone = run.stage("a", &Limits::default()).unwrap();
        gone.remove().unwrap();
        let next = run.stage("b", &Limits::default()).unwrap();
        assert_eq!(next.path(), gone.path(), "the idle cgroup is reused");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        std::fs::write(next.path().join("cgroup.procs"), child.id().to_string()).unwrap();
        // What a stop of the first stage still in flight would do.
        gone.kill();
        assert!(gone.members().is_empty() && !gone.populated());
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            child.try_wait().unwrap().is_none(),
            "the reusing stage's process was killed"
        );
        assert_eq!(next.members(), vec![child.id() as i32]);
        next.kill();
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    }

    #[test]
    fn limits_become_the_kernels_files() {
        let limits = Limits {
            memory: Some(256 << 20),
            pids: Some(64),
            cpus: Some(0.5),
        };
        assert_eq!(
            limits.files(),
            [
                ("memory.max", "268435456".to_string()),
                ("memory.swap.max", "0".to_string()),
                ("pids.max", "64".to_string()),
                ("cpu.max", "50000 100000".to_string()),
            ]
        );
        assert_eq!(limits.requested().len(), 3);
        assert!(Limits::default().requested().is_empty());
        assert_eq!(counter("low 0\noom 2\noom_kill 1\n", "oom_kill"), Some(1));
        assert_eq!(counter("populated 0\nfrozen 0\n", "populated"), Some(0));
        assert_eq!(counter("populated 0\n", "oom_kill"), None);
    }
}
