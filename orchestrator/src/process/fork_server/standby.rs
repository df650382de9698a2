//! Standbys: fork-server children that start the CUDA driver ahead of the stage they become.
//!
//! When a built-in worker says its device work is about to end (`finishing`), the run asks
//! its server for a standby under that worker's environment ([`request`]): a child with a
//! worker's process attributes that runs `cuInit` (no context, no device memory, nothing NVML
//! lists, so the finishing stage's release is checked as before) and waits on a socket of its
//! own. The next built-in stage forked through that server with the same driver variables
//! ([`protocol::fork::driver_env`]: the same GPUs, among others) adopts it ([`adopt`]: moved
//! into the stage's cgroup, if it has one) instead of being forked: it saves the driver's start (about 0.1 s on an H200)
//! and the fork, on the path from one stage's release to the next one's first step.
//!
//! Nothing is left behind: a standby not adopted within [`STANDBY_TTL`] is killed (it also
//! exits by itself when its socket closes), every one is killed when the servers are shut
//! down, and a failed adoption (or a standby that NVML lists on the stage's GPUs, which would
//! mean it created a context) kills it and forks the stage as usual. Standbys are killed
//! through a pidfd, so a reused PID is never signalled. `ORCHESTRATE_STANDBY=0` turns them off.

use super::{owned, read_reply, send_with_fds, ReplyError, Server, Worker, FORK_TIMEOUT};
use protocol::fork::{driver_env, Adopt, ForkReply, ForkRequest};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a standby waits to be adopted before it is killed.
pub const STANDBY_TTL: Duration = Duration::from_secs(60);

/// Workers whose environment is remembered (the most recent ones), for [`forked_env`].
const REMEMBERED: usize = 256;

/// A standby waiting for its stage.
struct Standby {
    program: PathBuf,
    /// The environment it was asked for under: it started the driver under its driver
    /// variables ([`Standby::driver`]), and a standby carried over to a newer server is asked
    /// for under it again ([`Standbys::carry_over`]).
    env: Vec<(String, String)>,
    pid: i32,
    pidfd: OwnedFd,
    sock: UnixStream,
    since: Instant,
    /// Whether it may be adopted now: a built-in worker's at once (its driver's start is short
    /// and overlaps the hand-over); a zygote's once it said so ([`Standby::readiness`]).
    ready: bool,
}

impl Standby {
    /// The driver variables it started the driver under.
    fn driver(&self) -> Vec<(String, String)> {
        driver_of(pairs(&self.env))
    }

    /// Whether it may be adopted now, never waiting: a standby that announces readiness (a
    /// zygote's, which imports modules first) is ready once its `Ready` can be read, and gone
    /// when it closed its socket or said something else instead (it exited: the zygote's log
    /// says why).
    fn readiness(&mut self) -> Readiness {
        if self.ready {
            return Readiness::Ready;
        }
        let mut poll = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd that lives across the call; a zero timeout.
        if unsafe { libc::poll(&mut poll, 1, 0) } != 1 {
            return Readiness::NotYet;
        }
        let _ = self.sock.set_read_timeout(Some(FORK_TIMEOUT));
        match read_reply(&mut self.sock) {
            Ok(ForkReply::Ready { .. }) => {
                self.ready = true;
                Readiness::Ready
            }
            Ok(reply) => {
                Readiness::Gone(format!("the standby answered {reply:?} instead of ready"))
            }
            Err(_) => Readiness::Gone(
                "the standby exited before it was ready (its zygote's log says why)".into(),
            ),
        }
    }
}

/// What [`Standby::readiness`] found.
enum Readiness {
    Ready,
    NotYet,
    Gone(String),
}

/// A worker forked with GPUs: its program and environment, kept for its standby.
struct Forked {
    pid: i32,
    program: PathBuf,
    env: Vec<(String, String)>,
}

/// The standbys of a host's fork servers, and the workers they may be asked for on behalf of.
/// Part of the host's fork servers ([`super::Servers`]); stopped with them.
pub struct Standbys {
    /// Whether standbys are on (`ORCHESTRATE_STANDBY`).
    enabled: bool,
    waiting: RefCell<Vec<Standby>>,
    /// Why the last request for a program's standby failed, until a stage of it is told.
    failed: RefCell<Vec<(PathBuf, String)>>,
    forked: RefCell<VecDeque<Forked>>,
}

/// Whether a worker or stage with environment `env` is given GPUs (a standby is only ever
/// readied after one).
pub(crate) fn gives_gpus(env: &[(&str, &str)]) -> bool {
    env.iter()
        .any(|(k, v)| *k == "CUDA_VISIBLE_DEVICES" && !v.is_empty())
}

/// The driver variables of an environment, owned ([`driver_env`]).
fn driver_of<'a>(env: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<(String, String)> {
    owned(&driver_env(env))
}

/// An owned environment as the pairs [`driver_of`] reads.
fn pairs(env: &[(String, String)]) -> impl Iterator<Item = (&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str()))
}

/// Sends the standby request and reads the server's answer: the standby's PID, a pidfd of it
/// and our end of its socket.
fn start(
    server: &mut Server,
    env: &[(String, String)],
) -> Result<(i32, OwnedFd, UnixStream), String> {
    let (ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
    let null = std::fs::File::options()
        .write(true)
        .open("/dev/null")
        .map_err(|e| e.to_string())?;
    let request = ForkRequest {
        v: protocol::PROTOCOL_VERSION,
        argv: Vec::new(),
        env: env.to_vec(),
        cwd: PathBuf::from("/"),
        parent: std::process::id(),
        cgroup: None,
        cgroup_namespace: false,
        standby: true,
    };
    let body = serde_json::to_vec(&request).expect("request serializes");
    let fds = [null.as_raw_fd(), null.as_raw_fd(), theirs.as_raw_fd()];
    send_with_fds(&server.sock, &body, &fds).map_err(|e| e.to_string())?;
    drop(theirs);
    server
        .sock
        .set_read_timeout(Some(FORK_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let pid = match read_reply(&mut server.sock) {
        Ok(ForkReply::Forked { pid, .. }) => pid as i32,
        Ok(reply) => return Err(format!("the server answered {reply:?}")),
        Err(e) => return Err(e.to_string()),
    };
    let pidfd = pidfd_open(pid).map_err(|e| format!("no pidfd for standby {pid}: {e}"))?;
    Ok((pid, pidfd, ours))
}

fn hand_over(
    standby: &Standby,
    message: &Adopt,
    stdout: &OwnedFd,
    stderr: &OwnedFd,
) -> Result<(), ReplyError> {
    let body = serde_json::to_vec(message).expect("adoption serializes");
    send_with_fds(
        &standby.sock,
        &body,
        &[stdout.as_raw_fd(), stderr.as_raw_fd()],
    )?;
    let mut sock = standby.sock.try_clone()?;
    sock.set_read_timeout(Some(FORK_TIMEOUT))?;
    match read_reply(&mut sock)? {
        ForkReply::Forked { pid, .. } if pid as i32 == standby.pid => Ok(()),
        ForkReply::Refused { reason } => Err(ReplyError::Io(std::io::Error::other(format!(
            "it refused the stage: {reason}"
        )))),
        reply => Err(ReplyError::Io(std::io::Error::other(format!(
            "the standby answered {reply:?}"
        )))),
    }
}

impl Standbys {
    /// None yet; `enabled`: whether any will be asked for.
    pub fn new(enabled: bool) -> Standbys {
        Standbys {
            enabled,
            waiting: RefCell::new(Vec::new()),
            failed: RefCell::new(Vec::new()),
            forked: RefCell::new(VecDeque::new()),
        }
    }

    /// Whether standbys are on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Notes the environment worker `pid` was started with, when it was given GPUs (a standby is
    /// only ever asked for on behalf of such a worker).
    pub fn remember(&self, pid: i32, program: &Path, env: &[(&str, &str)]) {
        if !gives_gpus(env) || !self.enabled {
            return;
        }
        let mut f = self.forked.borrow_mut();
        if f.len() == REMEMBERED {
            f.pop_front();
        }
        f.push_back(Forked {
            pid,
            program: program.to_path_buf(),
            env: owned(env),
        });
    }

    /// The program and environment worker `pid` was started with, if [`remember`] kept them (they
    /// are forgotten now: one standby per worker).
    pub fn forked_env(&self, pid: i32) -> Option<(PathBuf, Vec<(String, String)>)> {
        let mut f = self.forked.borrow_mut();
        let at = f.iter().position(|w| w.pid == pid)?;
        f.remove(at).map(|w| (w.program, w.env))
    }

    /// Asks `server` (of `program`) for a standby under `env`, unless one with the same driver
    /// variables is waiting already; `announces_ready`: the standby says `Ready` once it may be
    /// adopted (a zygote's), and is passed over until then. A failure is logged and costs
    /// nothing else.
    pub fn request(
        &self,
        server: &mut Server,
        program: &Path,
        env: &[(String, String)],
        announces_ready: bool,
    ) {
        self.expire();
        let driver = driver_of(pairs(env));
        let waiting =
            (self.waiting.borrow().iter()).any(|w| w.program == program && w.driver() == driver);
        if waiting {
            return;
        }
        match start(server, env) {
            Ok((pid, pidfd, sock)) => {
                tracing::debug!(pid, "standby started");
                // Re-parented to this process but no stage's until one adopts it: the stage whose
                // `finishing` readied it must not count it among its leftovers.
                crate::process::scan::note_helper(pid);
                self.waiting.borrow_mut().push(Standby {
                    program: program.to_path_buf(),
                    env: env.to_vec(),
                    pid,
                    pidfd,
                    sock,
                    since: Instant::now(),
                    ready: !announces_ready,
                });
            }
            Err(why) => {
                tracing::debug!("no standby: {why}");
                let mut failed = self.failed.borrow_mut();
                failed.retain(|(p, _)| p != program);
                failed.push((
                    program.to_path_buf(),
                    format!("no standby could be started: {why}"),
                ));
            }
        }
    }

    /// Makes a waiting standby of `program` with the driver variables of `worker`'s environment
    /// that worker (see [`Adopt`]), moved first into its cgroup if it has one; its PID, or why
    /// none was adopted (`None`: none was asked for) and the caller forks as usual: none ready
    /// (still importing: kept for a later stage), one gone or refused (killed), one that NVML
    /// lists on the stage's GPUs (it would hold a context: killed). (What the standby allocated
    /// before its move stays charged where it was: the driver's start-up, no stage data.)
    pub fn adopt(&self, program: &Path, worker: &Worker<'_>) -> Result<i32, Option<String>> {
        let Worker {
            argv,
            env,
            cwd,
            stdout,
            stderr,
            cgroup,
            cgroup_namespace,
            gpu_holders,
        } = *worker;
        self.expire();
        let (standby, passed_over) = self.take_ready(program, &driver_of(env.iter().copied()));
        let Some(standby) = standby else {
            let failed = {
                let mut failed = self.failed.borrow_mut();
                let at = failed.iter().position(|(p, _)| p == program);
                at.map(|at| failed.remove(at).1)
            };
            return Err(passed_over.or(failed));
        };
        let message = Adopt {
            v: protocol::PROTOCOL_VERSION,
            argv: argv.to_vec(),
            env: owned(env),
            cwd: cwd.to_path_buf(),
            cgroup_namespace,
        };
        if gpu_holders.contains(&(standby.pid as u32)) {
            tracing::warn!(
                pid = standby.pid,
                "a standby is listed on a GPU; killed, not adopted"
            );
            kill(&standby);
            return Err(Some(
                "NVML listed the standby on a GPU (it held a CUDA context): it was killed".into(),
            ));
        }
        let moved = cgroup.map_or(Ok(()), |dir| {
            std::fs::write(dir.join("cgroup.procs"), standby.pid.to_string())
        });
        let handed = match moved {
            Ok(()) => hand_over(&standby, &message, stdout, stderr),
            Err(e) => Err(ReplyError::Io(e)),
        };
        match handed {
            Ok(()) => {
                tracing::debug!(pid = standby.pid, "stage adopted a standby");
                crate::process::scan::forget_helper(standby.pid);
                Ok(standby.pid)
            }
            Err(why) => {
                tracing::debug!(pid = standby.pid, "standby not adopted: {why}");
                kill(&standby);
                Err(Some(format!("the standby was not taken on: {why}")))
            }
        }
    }

    /// Takes the first ready standby of `program` started under `driver` off the waiting list;
    /// else why none was (one still importing, gone, or started for other GPUs). A gone one
    /// is killed and dropped.
    fn take_ready(
        &self,
        program: &Path,
        driver: &[(String, String)],
    ) -> (Option<Standby>, Option<String>) {
        let mut waiting = self.waiting.borrow_mut();
        let mut why = None;
        let mut at = 0;
        while at < waiting.len() {
            let w = &mut waiting[at];
            if w.program != program {
                at += 1;
                continue;
            }
            if w.driver() != driver {
                why.get_or_insert_with(|| {
                    "the standby waiting was started for other GPUs (its driver variables differ)"
                        .to_string()
                });
                at += 1;
                continue;
            }
            match w.readiness() {
                Readiness::Ready => return (Some(waiting.remove(at)), None),
                Readiness::NotYet => {
                    why = Some(format!(
                        "the standby was still importing (started {:.1} s before): kept for a later stage",
                        w.since.elapsed().as_secs_f64()
                    ));
                    at += 1;
                }
                Readiness::Gone(reason) => {
                    kill(&waiting.remove(at));
                    why = Some(reason);
                }
            }
        }
        (None, why)
    }

    /// Replaces the standbys of `from` (a zygote generation being retired) with standbys of
    /// `to`, asked of `server` (its successor) under the same environments (a zygote's
    /// standbys, which say when they are ready): a stage that comes
    /// after a new generation took over still finds its standby, which imported what the new
    /// generation has. The old ones are killed, ready or not. Returns how many were asked for.
    pub fn carry_over(&self, from: &Path, server: &mut Server, to: &Path) -> usize {
        let old: Vec<Standby> = {
            let mut waiting = self.waiting.borrow_mut();
            let (old, rest) = std::mem::take(&mut *waiting)
                .into_iter()
                .partition(|w| w.program == from);
            *waiting = rest;
            old
        };
        for standby in &old {
            kill(standby);
            self.request(server, to, &standby.env, true);
        }
        old.len()
    }

    /// Kills the standbys that waited longer than [`STANDBY_TTL`].
    fn expire(&self) {
        let old: Vec<Standby> = {
            let mut s = self.waiting.borrow_mut();
            let (old, young) = std::mem::take(&mut *s)
                .into_iter()
                .partition(|w| w.since.elapsed() > STANDBY_TTL);
            *s = young;
            old
        };
        for w in &old {
            kill(w);
        }
    }

    /// Kills every waiting standby whose environment sets `name` to `value`: what it was
    /// readied under is going away (an MPS daemon that quits, which a standby that started the
    /// driver under it would keep waiting).
    pub fn stop_where(&self, name: &str, value: &str) {
        let (gone, kept): (Vec<Standby>, Vec<Standby>) =
            std::mem::take(&mut *self.waiting.borrow_mut())
                .into_iter()
                .partition(|w| w.env.iter().any(|(k, v)| k == name && v == value));
        *self.waiting.borrow_mut() = kept;
        for w in &gone {
            kill(w);
        }
    }

    /// Kills every waiting standby (the servers are being shut down).
    pub fn stop_all(&self) {
        let all = std::mem::take(&mut *self.waiting.borrow_mut());
        for w in &all {
            kill(w);
        }
    }
}

/// SIGKILL through the standby's pidfd (never another process that took its PID); the reaper
/// collects it as an orphaned descendant.
fn kill(standby: &Standby) {
    // SAFETY: pidfd_send_signal on a pidfd we own, with no siginfo.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            standby.pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    match rc {
        0 => tracing::debug!(pid = standby.pid, "standby killed"),
        _ => tracing::debug!(pid = standby.pid, "standby already gone"),
    }
    crate::process::scan::forget_helper(standby.pid);
}

fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the descriptor is new and ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
