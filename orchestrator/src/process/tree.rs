//! Starting and stopping a stage's process tree. [`spawn`] is the one spawn path of the
//! orchestrator: a built-in worker is forked by the fork server (`crate::process::fork_server`)
//! when it can be, and exec'd otherwise; both give the same process, as promised below.
//!
//! Promises:
//! - every stage starts in a process group of its own (in a session of its own, or in the
//!   orchestrator's when it has a cgroup and there is no terminal: see [`spawn`]), with no
//!   controlling terminal, stdin closed and its output in log files;
//! - it gets SIGKILL if the orchestrator dies (`PR_SET_PDEATHSIG`, with the race against the
//!   parent dying before the flag was set closed by re-checking the parent);
//! - [`stop_tree`] returns only once no process of the stage is alive (or reports the ones
//!   the kernel would not kill).
//!
//! A stage given a cgroup ([`Launch::cgroup`], see [`crate::process::cgroup`]) has its
//! processes placed in it before they run (exec'd or forked by the fork server), in a cgroup
//! namespace of their own where the host allows. Its members are the cgroup's, wherever they
//! went, and also every process the subreaper's view gives it (`scan::stage_members`: its
//! session or group, their descendants, the orphans it claims) that is no longer in the
//! cgroup: a process that wrote itself into another cgroup's `cgroup.procs` is still the
//! stage's, found, reported and killed. SIGKILL is one write to `cgroup.kill`, and one signal
//! to each such escapee. The cgroup is removed once empty, after its counters were read
//! ([`StopSummary::cgroup`]).

use crate::process::cgroup::{CgroupUsage, StageCgroup};
use crate::process::reaper::{ExitWait, Reaper};
use crate::process::scan::{self, TOKEN_VAR};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What to start.
#[derive(Debug)]
pub struct Launch {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Variables added to the orchestrator's environment (inherited `ORCHESTRATE_*` are dropped).
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub cwd: PathBuf,
    /// Where stdout goes.
    pub stdout: OwnedFd,
    /// Where stderr goes.
    pub stderr: OwnedFd,
    /// Unique token of this attempt, exported to every process of the tree.
    pub token: String,
    /// A built-in worker that may be forked by the fork server instead of exec'd.
    pub fork_server: bool,
    /// PIDs that NVML lists on the stage's GPUs right now (a fork server among them has a
    /// CUDA context and is not used).
    pub gpu_holders: Vec<u32>,
    /// A Python command stage's `preload`: forked from the zygote that imported these when it
    /// can be (see `crate::process::zygote`), or that learns them (`"auto"`); `[]`: exec'd.
    pub preload: protocol::plan::Preload,
    /// Where `stdout` and `stderr` go once the stage has its own descriptors of them (closed
    /// there, off this thread); closed here when `None`.
    pub close_later: Option<crate::process::discard::Discards>,
    /// The stage's cgroup, when it has one: its processes start in it.
    pub cgroup: Option<StageCgroup>,
}

impl Launch {
    /// Gives the log descriptors to [`Launch::close_later`], if set (dropped otherwise).
    fn release_logs(self) {
        if let Some(list) = self.close_later {
            list.lock().unwrap_or_else(|e| e.into_inner()).push(
                crate::process::discard::Discarded::Logs([self.stdout, self.stderr]),
            );
        }
    }
}

/// A running stage tree.
#[derive(Debug)]
pub struct StageProcess {
    /// PID of the first process (session and group leader).
    pub pid: i32,
    /// The attempt's token.
    pub token: String,
    /// When it was started.
    pub started: Instant,
    /// Resolves with the first process's exit status.
    pub exit: ExitWait,
    /// Stages with `preload`: whether it was forked from the zygote, or why not.
    pub start: Option<protocol::report::StageStart>,
    /// Its cgroup, if it has one.
    pub cgroup: Option<StageCgroup>,
}

/// The orchestrator's environment without its own `ORCHESTRATE_*` variables: what every
/// stage inherits, written out for `execve` ([`crate::process::spawn::EnvBase`]). Read once (the
/// orchestrator never changes its environment).
fn inherited() -> &'static crate::process::spawn::EnvBase {
    static INHERITED: std::sync::OnceLock<crate::process::spawn::EnvBase> =
        std::sync::OnceLock::new();
    INHERITED.get_or_init(|| {
        let vars: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, _)| !k.starts_with("ORCHESTRATE_"))
            .collect();
        crate::process::spawn::EnvBase::new(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    })
}

/// What a stage's environment sets over the inherited one: `launch.env`, then the token.
/// Borrowed: a sweep starts thousands of stages, and a copy of every variable was a hundred
/// allocations each. A key set twice in `launch.env` keeps its last value; the token is the
/// orchestrator's.
fn stage_variables(launch: &Launch) -> Vec<(&str, &str)> {
    let mut env = Vec::with_capacity(launch.env.len() + 1);
    for (n, (key, value)) in launch.env.iter().enumerate() {
        if key != TOKEN_VAR && !launch.env[n + 1..].iter().any(|(k, _)| k == key) {
            env.push((key.as_str(), value.as_str()));
        }
    }
    env.push((TOKEN_VAR, launch.token.as_str()));
    env
}

/// The whole environment a stage process gets: the inherited one ([`inherited`]) without
/// the variables the stage sets, then [`stage_variables`].
fn stage_environment(launch: &Launch) -> Vec<(&str, &str)> {
    let own = stage_variables(launch);
    let mut env: Vec<(&str, &str)> = inherited()
        .iter()
        .filter(|(k, _)| !own.iter().any(|(o, _)| o == k))
        .collect();
    env.extend(own);
    env
}

/// Starts `launch` as a process group of its own (see `leads`; forked by one of `forkers`,
/// where it can, in a session of its own). The child is registered with `reaper` before
/// returning.
pub fn spawn(
    mut launch: Launch,
    reaper: &Reaper,
    forkers: &crate::process::forkers::Forkers,
) -> io::Result<StageProcess> {
    if launch.argv.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty command"));
    }
    if launch.fork_server && forkers.fork_servers.enabled() {
        let env = stage_environment(&launch);
        let worker = crate::process::fork_server::Worker {
            argv: &launch.argv,
            env: &env,
            cwd: &launch.cwd,
            stdout: &launch.stdout,
            stderr: &launch.stderr,
            gpu_holders: &launch.gpu_holders,
            cgroup: launch.cgroup.as_ref().map(StageCgroup::path),
            cgroup_namespace: namespaced(&launch),
        };
        match forkers.fork_servers.spawn(&worker, reaper) {
            Ok(pid) => return Ok(forked(pid, launch, reaper, None)),
            Err(why) => tracing::debug!("not through the fork server: {why}"),
        }
    }
    let mut start = None;
    if !launch.preload.is_off() {
        use protocol::report::{StageStart, StartVia};
        let env = stage_environment(&launch);
        let stage = crate::process::zygote::PythonStage {
            worker: crate::process::fork_server::Worker {
                argv: &launch.argv,
                env: &env,
                cwd: &launch.cwd,
                stdout: &launch.stdout,
                stderr: &launch.stderr,
                gpu_holders: &launch.gpu_holders,
                cgroup: launch.cgroup.as_ref().map(StageCgroup::path),
                cgroup_namespace: namespaced(&launch),
            },
            preload: &launch.preload,
        };
        let fallback = match forkers.zygotes.spawn(&stage, reaper) {
            Ok(child) => {
                drop(env);
                let via = StageStart {
                    via: StartVia::Zygote,
                    fallback: None,
                    generation: Some(child.generation),
                    imported: None,
                    left_out: child.left_out,
                    read_ahead: child.read_ahead,
                    standby: child.standby,
                    standby_passed_over: child.standby_passed_over,
                };
                return Ok(forked(child.pid, launch, reaper, Some(via)));
            }
            Err(why) => why.to_string(),
        };
        tracing::debug!("not forked from a zygote: {fallback}");
        start = Some(StageStart {
            via: StartVia::Exec,
            fallback: Some(fallback),
            generation: None,
            imported: None,
            left_out: Vec::new(),
            read_ahead: None,
            standby: false,
            standby_passed_over: None,
        });
    }
    let env = stage_variables(&launch);
    static DEV_NULL: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();
    let stdin = match DEV_NULL.get() {
        Some(file) => file,
        None => {
            let file = std::fs::File::open("/dev/null")?;
            DEV_NULL.get_or_init(|| file)
        }
    };
    let spawned_after = scan::ticks_now();
    let spawned = crate::process::spawn::spawn(&crate::process::spawn::Request {
        argv: &launch.argv,
        env: &env,
        env_base: Some(inherited()),
        cwd: &launch.cwd,
        stdin: stdin.as_fd(),
        stdout: launch.stdout.as_fd(),
        stderr: launch.stderr.as_fd(),
        pidfd: reaper.wants_pidfds(),
        cgroup_procs: launch.cgroup.as_ref().and_then(StageCgroup::procs_fd),
        cgroup_dir: launch.cgroup.as_ref().and_then(StageCgroup::dir_fd),
        cgroup_namespace: namespaced(&launch),
        leads: leads(&launch),
    })?;
    let exit = match spawned.pidfd {
        Some(pidfd) => reaper.watch_pidfd(spawned.pid, pidfd),
        None => reaper.watch(spawned.pid),
    };
    drop(env);
    scan::note_stage(spawned.pid, &launch.token, Some(spawned_after));
    let process = StageProcess {
        pid: spawned.pid,
        token: std::mem::take(&mut launch.token),
        started: Instant::now(),
        exit,
        start,
        cgroup: launch.cgroup.take(),
    };
    launch.release_logs();
    Ok(process)
}

/// What an exec'd stage's first process leads: a process group of its own in the
/// orchestrator's session when the stage has a cgroup of its own and the orchestrator has no
/// controlling terminal, else a session of its own.
///
/// The group is the lighter of the two: a new session also makes a scheduler autogroup where
/// the kernel has them, 8–26 µs a spawn on the development machine (`bench/overhead`,
/// `session_spawn.c`). Where it is chosen, the cgroup holds every process of the stage that
/// stays in it (with `nsdelegate`, every process), and with no terminal there is none for a
/// stage to read or be stopped by. One difference is left: a process that leaves the cgroup
/// (root can, without `nsdelegate`) may also join the orchestrator's own process group, which
/// a session would not let it; it is still found by the stage's token it carries, but not once
/// it has also dropped its environment (see `crate::process::scan`). Where the orchestrator
/// has a terminal, a stage in a group of its session could open `/dev/tty`, so it gets a
/// session, as it does with no cgroup.
fn leads(launch: &Launch) -> crate::process::spawn::Leads {
    use crate::process::spawn::Leads;
    if launch.cgroup.is_some() && !has_terminal() {
        Leads::Group
    } else {
        Leads::Session
    }
}

/// Whether the stage's processes enter a cgroup namespace rooted at its cgroup.
fn namespaced(launch: &Launch) -> bool {
    launch.cgroup.as_ref().is_some_and(StageCgroup::namespaced)
}

/// Whether this process has a controlling terminal (asked once: the orchestrator never opens a
/// terminal that could become its own).
fn has_terminal() -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOCTTY)
            .open("/dev/tty")
            .is_ok()
    })
}

/// The stage process a fork server or zygote started for `launch`, registered.
fn forked(
    pid: i32,
    mut launch: Launch,
    reaper: &Reaper,
    start: Option<protocol::report::StageStart>,
) -> StageProcess {
    scan::note_stage(pid, &launch.token, None);
    let process = StageProcess {
        pid,
        token: std::mem::take(&mut launch.token),
        started: Instant::now(),
        exit: reaper.watch(pid),
        start,
        cgroup: launch.cgroup.take(),
    };
    launch.release_logs();
    process
}

impl StageProcess {
    /// Sends `signal` to the stage's process group and to every process of its tree (found
    /// by its token, wherever it went: another session, another group).
    pub fn signal(&self, signal: Signal) {
        match &self.cgroup {
            Some(cgroup) => signal_cgroup(self.pid, &self.token, cgroup, signal),
            None => signal_tree(self.pid, &self.token, signal),
        }
    }

    /// Sends `signal` to the first process only (a stage that signals its own children).
    pub fn signal_leader(&self, signal: Signal) {
        let _ = kill(Pid::from_raw(self.pid), signal);
    }

    /// Every live process of the stage, with its name.
    pub fn members(&self) -> Vec<StoppedProcess> {
        match &self.cgroup {
            Some(cgroup) => named(cgroup_members(self.pid, &self.token, cgroup)),
            None => describe(self.pid, &self.token),
        }
    }

    /// Whether live process `pid` is one of the stage's: its first process, a member of its
    /// cgroup, a process whose environment carries the stage's token, or one the subreaper's
    /// view gives the stage (see `scan::stage_members`), whatever cgroup it is in.
    pub fn owns(&self, pid: i32) -> bool {
        if pid == self.pid {
            return true;
        }
        if let Some(cgroup) = &self.cgroup {
            if cgroup.members().contains(&pid) {
                return true;
            }
        }
        let entry = format!("{}={}", scan::TOKEN_VAR, self.token);
        scan::environ_any(pid, |e| e == entry.as_bytes())
            || scan::stage_members(self.pid, &self.token)
                .iter()
                .any(|p| p.pid == pid)
    }

    /// The memory the stage uses: its cgroup's `memory.current` when the memory controller
    /// counts it, else the resident memory of every live process of the stage, summed.
    pub fn resident_bytes(&self) -> u64 {
        if let Some(current) = self.cgroup.as_ref().and_then(StageCgroup::memory_current) {
            return current;
        }
        let pids: Vec<i32> = match &self.cgroup {
            Some(cgroup) => cgroup_members(self.pid, &self.token, cgroup),
            None => scan::stage_members(self.pid, &self.token)
                .iter()
                .map(|p| p.pid)
                .collect(),
        };
        pids.into_iter().map(scan::rss_bytes).sum()
    }

    /// Stops every process of the stage and reaps it; see [`stop_tree`] (with a cgroup: the
    /// same promises, through its membership and `cgroup.kill`; then its counters are read
    /// and it is removed).
    pub async fn stop(&self, grace: Duration, reaper: &Reaper) -> StopSummary {
        match &self.cgroup {
            Some(cgroup) => stop_cgroup(self.pid, &self.token, cgroup, grace, reaper).await,
            None => stop_tree(self.pid, &self.token, grace, reaper).await,
        }
    }
}

/// Sends `signal` to the stage's process group, every process of its cgroup (SIGKILL: the
/// whole cgroup at once, by `cgroup.kill`) and every process of it that left the cgroup
/// ([`escaped`]), once to each process.
fn signal_cgroup(leader: i32, token: &str, cgroup: &StageCgroup, signal: Signal) {
    let _ = killpg(Pid::from_raw(leader), signal);
    let members = cgroup.members();
    let outside = escaped(leader, token, &members);
    if signal == Signal::SIGKILL {
        cgroup.kill();
    } else {
        for &pid in &members {
            signal_outside_group(pid, leader, signal);
        }
    }
    for pid in outside {
        signal_outside_group(pid, leader, signal);
    }
}

/// The processes of the stage whose first process is `leader` that the subreaper's view
/// gives it (`scan::stage_members`: its session or group, their descendants, the orphans it claims)
/// and that are not among `in_cgroup`: they wrote themselves into another cgroup. Costs no
/// scan of `/proc` once the stage's process group is empty and no orphan is about.
fn escaped(leader: i32, token: &str, in_cgroup: &[i32]) -> Vec<i32> {
    scan::stage_members(leader, token)
        .into_iter()
        .map(|p| p.pid)
        .filter(|pid| !in_cgroup.contains(pid))
        .collect()
}

/// Every live process of a stage with a cgroup: the cgroup's, then those that left it
/// ([`escaped`]).
fn cgroup_members(leader: i32, token: &str, cgroup: &StageCgroup) -> Vec<i32> {
    let mut pids = cgroup.members();
    let outside = escaped(leader, token, &pids);
    pids.extend(outside);
    pids
}

/// Sends `signal` to `pid` unless it is in the process group `leader` leads, which
/// `killpg` just signalled: a process asked to stop gets one SIGTERM from us, not two. (A
/// second one is not harmless: a handler that takes a lock, as Python's `threading.Event.set`
/// does, deadlocks when the second lands while the first is being handled.)
fn signal_outside_group(pid: i32, leader: i32, signal: Signal) {
    let pid = Pid::from_raw(pid);
    if nix::unistd::getpgid(Some(pid)) != Ok(Pid::from_raw(leader)) {
        let _ = kill(pid, signal);
    }
}

fn named(pids: Vec<i32>) -> Vec<StoppedProcess> {
    pids.into_iter()
        .map(|pid| StoppedProcess {
            pid,
            name: scan::comm(pid),
        })
        .collect()
}

/// [`stop_tree`] for a stage with a cgroup: SIGTERM to its members, those that left the
/// cgroup included (unless `grace` is zero), up to `grace` for them to go, then `cgroup.kill`
/// and SIGKILL to those outside until none is left (10 s at most); then its counters, and the
/// cgroup removed (when nothing was found: once its handle is dropped, see
/// [`StageCgroup::seen_empty`]).
async fn stop_cgroup(
    leader: i32,
    token: &str,
    cgroup: &StageCgroup,
    grace: Duration,
    reaper: &Reaper,
) -> StopSummary {
    struct Over(i32);
    impl Drop for Over {
        fn drop(&mut self) {
            scan::forget_stage(self.0);
        }
    }
    let _over = Over(leader);
    // An empty cgroup and an empty process group with no orphan about (the usual end: the
    // stage's one process is gone) cost one read and one check.
    let inside = match cgroup.populated() {
        true => cgroup.members(),
        false => Vec::new(),
    };
    let outside = escaped(leader, token, &inside);
    let mut summary = StopSummary {
        found: named(inside.into_iter().chain(outside).collect()),
        ..Default::default()
    };
    let gone = |limit| {
        crate::process::backoff::poll(limit, Duration::from_millis(10), || {
            reaper.reap_now();
            !cgroup.populated() && escaped(leader, token, &[]).is_empty()
        })
    };
    if !summary.found.is_empty() {
        let mut done = false;
        if !grace.is_zero() {
            signal_cgroup(leader, token, cgroup, Signal::SIGTERM);
            done = gone(grace).await;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done {
            signal_cgroup(leader, token, cgroup, Signal::SIGKILL);
            done = gone(Duration::from_millis(200)).await;
            if !done && Instant::now() > deadline {
                summary.survivors = named(cgroup_members(leader, token, cgroup));
                break;
            }
        }
        // What was stopped is reaped before its counters are read. (With nothing found there is
        // nothing of the stage to reap: the reaper's task reaps any other child at its SIGCHLD.)
        reaper.reap_now();
    }
    summary.cgroup = Some(cgroup.usage());
    if summary.survivors.is_empty() {
        // Nothing found at all (the usual end): the empty cgroup just read is not read again,
        // and goes when the stage's handle does (after a hand-over to its successor).
        match summary.found.is_empty() {
            true => cgroup.seen_empty(),
            false => {
                if let Err(e) = cgroup.remove() {
                    tracing::warn!("{e}");
                }
            }
        }
    }
    summary
}

/// Sends `signal` to the stage's process group and to every process of its tree, once to
/// each process.
fn signal_tree(leader: i32, token: &str, signal: Signal) {
    let _ = killpg(Pid::from_raw(leader), signal);
    for p in scan::stage_members(leader, token) {
        signal_outside_group(p.pid, leader, signal);
    }
}

/// A process that had to be stopped, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoppedProcess {
    /// Its PID.
    pub pid: i32,
    /// Its command name.
    pub name: String,
}

/// What [`stop_tree`] did.
#[derive(Debug, Default, Clone)]
pub struct StopSummary {
    /// Processes found alive when stopping began.
    pub found: Vec<StoppedProcess>,
    /// Processes still alive after SIGKILL and a wait (uninterruptible sleep): should be empty.
    pub survivors: Vec<StoppedProcess>,
    /// The counters of the stage's cgroup, read once it was empty (`None`: it had none).
    pub cgroup: Option<CgroupUsage>,
}

fn describe(leader: i32, token: &str) -> Vec<StoppedProcess> {
    scan::stage_members(leader, token)
        .into_iter()
        .map(|p| StoppedProcess {
            pid: p.pid,
            name: scan::comm(p.pid),
        })
        .collect()
}

/// Stops every process of the stage: SIGTERM (unless `grace` is zero), up to `grace` for them
/// to exit, then SIGKILL; returns once none is alive, or after 10 s more with the survivors.
/// The stage is then over: orphans born later are not its (`scan::forget_stage`).
pub async fn stop_tree(leader: i32, token: &str, grace: Duration, reaper: &Reaper) -> StopSummary {
    /// Forgets the stage however `stop_tree` ends (returned, or dropped half-way).
    struct Over(i32);
    impl Drop for Over {
        fn drop(&mut self) {
            scan::forget_stage(self.0);
        }
    }
    let _over = Over(leader);
    let found = describe(leader, token);
    let mut summary = StopSummary {
        found,
        ..Default::default()
    };
    if summary.found.is_empty() {
        return summary;
    }
    if !grace.is_zero() {
        signal_tree(leader, token, Signal::SIGTERM);
        if wait_until_gone(leader, token, grace, reaper).await {
            return summary;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        signal_tree(leader, token, Signal::SIGKILL);
        if wait_until_gone(leader, token, Duration::from_millis(200), reaper).await {
            return summary;
        }
        if Instant::now() > deadline {
            summary.survivors = describe(leader, token);
            return summary;
        }
    }
}

/// Polls until no process of the stage is alive; false if `limit` passed first.
async fn wait_until_gone(leader: i32, token: &str, limit: Duration, reaper: &Reaper) -> bool {
    crate::process::backoff::poll(limit, Duration::from_millis(25), || {
        reaper.reap_now();
        scan::stage_members(leader, token).is_empty()
    })
    .await
}

/// The name of a signal number ("SIGSEGV"), or "signal N".
pub fn signal_name(signal: i32) -> String {
    Signal::try_from(signal)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {signal}"))
}
