//! Starting built-in workers through a fork server (see `stage-worker fork-server`).
//!
//! One server per `stage-worker` binary and host ([`Servers`], which the host owns), started on
//! first use as a child of this process
//! (so a worker it forks through an intermediate process is re-parented to us, a child
//! subreaper). The worker is then our child like an exec'd one: the [`Reaper`] collects its
//! exit status and resource usage, [`crate::process::scan`] finds it as a session leader, and
//! `stop_tree` stops it. The server never holds a stage's process; killing it leaves every
//! running stage alone.
//!
//! Every failure falls back to `exec`: the server cannot start, refuses (it has initialised
//! a device, or NVML lists it on the stage's GPUs), dies, or answers wrongly. After the first
//! failure the host stops using that binary's server.
//!
//! Set `ORCHESTRATE_FORK_SERVER=0` to always exec.

pub(super) mod standby;

use crate::process::reaper::Reaper;
use protocol::fork::{ForkReply, ForkRequest, FORK_SERVER_SUBCOMMAND};
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// How long a new server may take to load libtorch and say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a fork may take.
const FORK_TIMEOUT: Duration = Duration::from_secs(10);

/// A running fork server (a `stage-worker` one, or a Python zygote of
/// [`crate::process::zygote`]).
pub(super) struct Server {
    pub(super) pid: i32,
    sock: UnixStream,
    exit: crate::process::reaper::ExitWait,
    reaper: Reaper,
    /// The environment variables its start-up read (see [`ForkReply::Ready`]).
    pub(super) env_read: Vec<String>,
    /// A Python zygote: the learned modules it left out (see [`ForkReply::Ready`]).
    pub(super) left_out: Vec<protocol::fork::LeftOut>,
    /// A Python zygote: what it read ahead and imported (see [`ForkReply::Ready`]).
    pub(super) read_ahead: Option<protocol::fork::ReadAhead>,
}

enum State {
    Serving(Server),
    /// Not used again in this process, and why.
    Failed(Arc<ForkServerError>),
}

/// Why a worker was not started through the fork server (the caller execs it instead).
#[derive(Debug, thiserror::Error)]
pub enum ForkServerError {
    /// The command line is empty.
    #[error("empty command")]
    EmptyCommand,
    /// This process is not a child subreaper, so a forked worker would not be its child.
    #[error("orchestrate is not a child subreaper here")]
    NotSubreaper,
    /// The socket to the server could not be made.
    #[error("cannot create a socket pair: {0}")]
    SocketPair(#[source] io::Error),
    /// The server could not be started.
    #[error("cannot start the fork server `{}`: {source}", program.display())]
    Start {
        /// The server's program (a `stage-worker` binary, or a Python interpreter).
        program: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// The server refused (to start, or to fork): it initialised a device, for example.
    #[error("the fork server refused: {reason}")]
    Refused {
        /// Its reason.
        reason: String,
    },
    /// The server says its loaded code no longer matches the disk (see [`ForkReply::Stale`]):
    /// it exits, and a fresh one may serve.
    #[error("{reason}")]
    Stale {
        /// What changed.
        reason: String,
    },
    /// The new server said it is ready with more than one thread: a fork would copy locks
    /// the other threads hold.
    #[error("the fork server runs {threads} threads; it may fork only with one")]
    Threads {
        /// How many it said.
        threads: u32,
    },
    /// The new server said something other than that it is ready.
    #[error("the fork server answered {reply:?} instead of ready")]
    NotReady {
        /// What it said.
        reply: ForkReply,
    },
    /// The new server did not say it is ready.
    #[error("the fork server did not start: {0}")]
    DidNotStart(#[source] ReplyError),
    /// The server is gone.
    #[error("the fork server exited")]
    Exited,
    /// NVML lists the server on one of the stage's GPUs.
    #[error("NVML lists the fork server (pid {pid}) on a GPU: it has a CUDA context")]
    OnGpu {
        /// The server's PID.
        pid: i32,
    },
    /// The request could not be sent.
    #[error("cannot send to the fork server: {0}")]
    Send(#[source] io::Error),
    /// The server tried to fork and failed.
    #[error("the fork server could not fork: {error}")]
    ForkFailed {
        /// What it said.
        error: String,
    },
    /// The server answered a fork request with something other than a fork's outcome.
    #[error("unexpected reply from the fork server: {reply:?}")]
    Unexpected {
        /// What it said.
        reply: ForkReply,
    },
    /// The server's reply could not be read.
    #[error(transparent)]
    Reply(#[from] ReplyError),
    /// The server failed earlier (this or a previous time) and is not used again.
    #[error(transparent)]
    Unusable(Arc<ForkServerError>),
}

/// Why a reply from the fork server could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReplyError {
    /// The socket failed or timed out.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The reply announces more bytes than a reply may have.
    #[error("a reply of {bytes} bytes")]
    TooLarge {
        /// Its announced length.
        bytes: usize,
    },
    /// The reply is not a reply.
    #[error("unreadable reply: {0}")]
    Unreadable(#[source] serde_json::Error),
}

/// The fork servers of one host, by program, with their standbys: owned by the host
/// (`crate::host::Host`, in its `crate::process::forkers::Forkers`) and stopped with it, so
/// that nothing of them outlives it. Lives on the host's thread.
pub struct Servers {
    /// Whether built-in workers start through a fork server (`ORCHESTRATE_FORK_SERVER`).
    enabled: bool,
    servers: RefCell<HashMap<PathBuf, State>>,
    standbys: standby::Standbys,
}

/// A worker to start through a fork server: everything its process is given.
pub struct Worker<'a> {
    /// Its command line, as it would be exec'd.
    pub argv: &'a [String],
    /// Its whole environment.
    pub env: &'a [(&'a str, &'a str)],
    /// Its working directory.
    pub cwd: &'a std::path::Path,
    /// Its stdout.
    pub stdout: &'a OwnedFd,
    /// Its stderr.
    pub stderr: &'a OwnedFd,
    /// The PIDs NVML lists on the stage's GPUs now: a server (or a standby) among them is
    /// not used.
    pub gpu_holders: &'a [u32],
    /// The stage's cgroup directory, if it has one: the worker is born in it (a standby is
    /// moved into it).
    pub cgroup: Option<&'a std::path::Path>,
    /// With `cgroup`: the worker enters a cgroup namespace rooted there
    /// (`crate::process::cgroup::StageCgroup::namespaced`).
    pub cgroup_namespace: bool,
}

impl Servers {
    /// None started yet (they start with the first worker of their program); `settings` says
    /// whether workers and standbys use them.
    pub fn new(settings: &crate::settings::Settings) -> Servers {
        Servers {
            enabled: settings.fork_server,
            servers: RefCell::new(HashMap::new()),
            standbys: standby::Standbys::new(settings.standby),
        }
    }

    /// Whether built-in workers start through a fork server.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Starts `worker` (a `stage-worker` command line) through the fork server of its `argv[0]`,
    /// or as the standby waiting for it ([`standby`]). Returns its PID: a child of this process,
    /// in its own session, not yet registered with `reaper` (register it before the next
    /// `.await`). An error says why the caller should exec instead.
    pub fn spawn(&self, worker: &Worker<'_>, reaper: &Reaper) -> Result<i32, ForkServerError> {
        let program = PathBuf::from(worker.argv.first().ok_or(ForkServerError::EmptyCommand)?);
        let mut servers = self.servers.borrow_mut();
        if let Some(State::Failed(why)) = servers.get(&program) {
            return Err(ForkServerError::Unusable(why.clone()));
        }
        if !servers.contains_key(&program) {
            let state = match start(&program, reaper) {
                Ok(server) => State::Serving(server),
                Err(why) => {
                    tracing::warn!(program = %program.display(), "fork server unavailable: {why}; workers are exec'd");
                    State::Failed(Arc::new(why))
                }
            };
            servers.insert(program.clone(), state);
        }
        let Some(State::Serving(server)) = servers.get_mut(&program) else {
            let Some(State::Failed(why)) = servers.get(&program) else {
                unreachable!("a server is serving or failed")
            };
            return Err(ForkServerError::Unusable(why.clone()));
        };
        if let Ok(pid) = self.standbys.adopt(&program, worker) {
            self.standbys.remember(pid, &program, worker.env);
            return Ok(pid);
        }
        match fork(server, worker) {
            Ok(pid) => {
                self.standbys.remember(pid, &program, worker.env);
                Ok(pid)
            }
            Err(why) => {
                tracing::warn!(program = %program.display(), "fork server stopped: {why}; workers are exec'd from now on");
                if let Some(State::Serving(server)) = servers.remove(&program) {
                    stop(server);
                }
                let why = Arc::new(why);
                servers.insert(program, State::Failed(why.clone()));
                Err(ForkServerError::Unusable(why))
            }
        }
    }

    /// Kills the waiting standbys whose environment sets `name` to `value` (see
    /// [`standby::Standbys::stop_where`]).
    pub fn stop_standbys_where(&self, name: &str, value: &str) {
        self.standbys.stop_where(name, value);
    }

    /// Asks the fork server that started worker `pid` for a standby under that worker's
    /// environment (see [`standby`]): done when `pid` announced that its device work is about to
    /// end, so that the stage that next gets its GPUs finds the CUDA driver started. Does nothing
    /// when standbys are off (`ORCHESTRATE_STANDBY=0`), `pid` was not forked by a server or asked
    /// for no GPU, or the server is not serving; a failure only costs the next stage that time.
    pub fn prepare_standby(&self, pid: i32) {
        if !self.standbys.enabled() {
            return;
        }
        let Some((program, env)) = self.standbys.forked_env(pid) else {
            return;
        };
        if let Some(State::Serving(server)) = self.servers.borrow_mut().get_mut(&program) {
            if server.exit.try_wait().is_none() {
                self.standbys.request(server, &program, &env, false);
            }
        }
    }

    /// Stops every fork server of the host and waits until they are gone.
    pub fn shutdown(&self) {
        self.standbys.stop_all();
        for (_, state) in self.servers.borrow_mut().drain() {
            if let State::Serving(server) = state {
                stop(server);
            }
        }
    }
}

/// Kills a server and waits (up to a second) until it has been reaped.
pub(super) fn stop(server: Server) {
    let Server {
        pid,
        sock,
        mut exit,
        reaper,
        ..
    } = server;
    drop(sock);
    // SAFETY: signalling a child of ours that the reaper has not collected (it holds `exit`).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    crate::process::backoff::poll_blocking(
        Duration::from_secs(1),
        Duration::from_millis(10),
        || {
            reaper.reap_now();
            exit.try_wait().is_some()
        },
    );
}

/// Whether this process is a child subreaper (required: the worker must be re-parented here).
fn is_subreaper() -> bool {
    let mut flag: libc::c_int = 0;
    // SAFETY: PR_GET_CHILD_SUBREAPER writes one int.
    let rc = unsafe { libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut flag as *mut libc::c_int) };
    rc == 0 && flag != 0
}

fn start(program: &std::path::Path, reaper: &Reaper) -> Result<Server, ForkServerError> {
    let mut cmd = Command::new(program);
    cmd.arg(FORK_SERVER_SUBCOMMAND).arg("--fd").arg("3");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("ORCHESTRATE_") {
            cmd.env_remove(key);
        }
    }
    start_server(cmd, READY_TIMEOUT, reaper)
}

/// Starts `cmd` as a fork server (its socket on descriptor 3, in a session of its own, killed
/// when this process dies) and waits up to `ready_timeout` until it says it is ready.
pub(super) fn start_server(
    cmd: Command,
    ready_timeout: Duration,
    reaper: &Reaper,
) -> Result<Server, ForkServerError> {
    let mut server = launch(cmd, reaper)?;
    let ready = server
        .sock
        .set_read_timeout(Some(ready_timeout))
        .map_err(ReplyError::Io)
        .and_then(|()| read_reply(&mut server.sock));
    readied(server, ready)
}

/// A fork server started whose readiness is awaited by a thread of its own, so that this one
/// goes on while the server loads what it preloads (a Python zygote's imports take seconds).
pub(super) struct Starting {
    server: Server,
    ready: std::sync::mpsc::Receiver<Result<ForkReply, ReplyError>>,
    since: std::time::Instant,
}

impl Starting {
    /// Its first reply, once it has come (ready, or why not); `None` while it is still
    /// starting. Never blocks. Give the reply to [`Starting::finish`].
    pub(super) fn poll(&self) -> Option<Result<ForkReply, ReplyError>> {
        use std::sync::mpsc::TryRecvError;
        match self.ready.try_recv() {
            Ok(reply) => Some(reply),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(Err(ReplyError::Io(io::Error::other(
                "the thread awaiting its readiness ended",
            )))),
        }
    }

    /// The server, serving if `reply` (from [`Starting::poll`]) says it is ready; else it is
    /// stopped and the error says why.
    pub(super) fn finish(
        self,
        reply: Result<ForkReply, ReplyError>,
    ) -> Result<Server, ForkServerError> {
        readied(self.server, reply)
    }

    /// How long ago it was started.
    pub(super) fn elapsed(&self) -> Duration {
        self.since.elapsed()
    }

    /// Kills it, as [`stop`] does a ready one.
    pub(super) fn stop(self) {
        stop(self.server)
    }
}

/// Starts `cmd` as [`start_server`] does, but returns at once: [`Starting::poll`] says when it
/// is ready (within `ready_timeout`, or never).
pub(super) fn start_server_in_background(
    cmd: Command,
    ready_timeout: Duration,
    reaper: &Reaper,
) -> Result<Starting, ForkServerError> {
    let since = std::time::Instant::now();
    let server = launch(cmd, reaper)?;
    let mut theirs = server
        .sock
        .try_clone()
        .map_err(ForkServerError::SocketPair)?;
    theirs
        .set_read_timeout(Some(ready_timeout))
        .map_err(|e| ForkServerError::DidNotStart(ReplyError::Io(e)))?;
    let (tell, ready) = std::sync::mpsc::sync_channel(1);
    let waiter = std::thread::Builder::new()
        .name("fork-server-ready".into())
        .spawn(move || {
            // The socket is shared: nothing else reads it until the reply has been handed over.
            let _ = tell.send(read_reply(&mut theirs));
        });
    if let Err(e) = waiter {
        stop(server);
        return Err(ForkServerError::DidNotStart(ReplyError::Io(e)));
    }
    Ok(Starting {
        server,
        ready,
        since,
    })
}

/// Spawns `cmd` as a fork server, registered with `reaper`; it has not said it is ready yet.
fn launch(mut cmd: Command, reaper: &Reaper) -> Result<Server, ForkServerError> {
    let program = PathBuf::from(cmd.get_program());
    if !is_subreaper() {
        return Err(ForkServerError::NotSubreaper);
    }
    let (ours, theirs) = UnixStream::pair().map_err(ForkServerError::SocketPair)?;
    let theirs_fd = theirs.as_raw_fd();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe functions.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(theirs_fd, 3) < 0 || libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|source| ForkServerError::Start {
        program: program.clone(),
        source,
    })?;
    let pid = child.id() as i32;
    drop(child);
    // In a session of its own but no stage's: never a stage's orphan.
    crate::process::scan::note_helper(pid);
    let exit = reaper.watch(pid);
    drop(theirs);
    Ok(Server {
        pid,
        sock: ours,
        exit,
        reaper: reaper.clone(),
        env_read: Vec::new(),
        left_out: Vec::new(),
        read_ahead: None,
    })
}

/// A launched server given its first reply: serving if it said it is ready, else stopped.
fn readied(
    mut server: Server,
    ready: Result<ForkReply, ReplyError>,
) -> Result<Server, ForkServerError> {
    match ready {
        Ok(ForkReply::Ready { threads, .. }) if threads > 1 => {
            stop(server);
            Err(ForkServerError::Threads { threads })
        }
        Ok(ForkReply::Ready {
            env_read,
            left_out,
            read_ahead,
            ..
        }) => {
            server.env_read = env_read;
            server.left_out = left_out;
            server.read_ahead = read_ahead;
            Ok(server)
        }
        Ok(ForkReply::Refused { reason }) => {
            stop(server);
            Err(ForkServerError::Refused { reason })
        }
        Ok(reply) => {
            stop(server);
            Err(ForkServerError::NotReady { reply })
        }
        Err(e) => {
            stop(server);
            Err(ForkServerError::DidNotStart(e))
        }
    }
}

/// Asks `server` for `worker` (see [`spawn`]); its PID.
pub(super) fn fork(server: &mut Server, worker: &Worker<'_>) -> Result<i32, ForkServerError> {
    fork_telling_lacks(server, worker).map(|(pid, _)| pid)
}

/// Asks `server` for `worker`, as [`fork`]; its PID, and what a Python zygote says the
/// worker's script imports that it lacks ([`ForkReply::Forked`]'s `lacks`).
pub(super) fn fork_telling_lacks(
    server: &mut Server,
    worker: &Worker<'_>,
) -> Result<(i32, Vec<String>), ForkServerError> {
    if server.exit.try_wait().is_some() {
        return Err(ForkServerError::Exited);
    }
    if worker.gpu_holders.contains(&(server.pid as u32)) {
        return Err(ForkServerError::OnGpu { pid: server.pid });
    }
    let request = ForkRequest {
        v: protocol::PROTOCOL_VERSION,
        argv: worker.argv.to_vec(),
        env: owned(worker.env),
        cwd: worker.cwd.to_path_buf(),
        parent: std::process::id(),
        cgroup: worker.cgroup.map(|c| c.to_path_buf()),
        cgroup_namespace: worker.cgroup_namespace,
        standby: false,
    };
    let body = serde_json::to_vec(&request).expect("request serializes");
    send_with_fds(
        &server.sock,
        &body,
        &[worker.stdout.as_raw_fd(), worker.stderr.as_raw_fd()],
    )
    .map_err(ForkServerError::Send)?;
    server
        .sock
        .set_read_timeout(Some(FORK_TIMEOUT))
        .map_err(ReplyError::Io)?;
    match read_reply(&mut server.sock)? {
        ForkReply::Forked { pid, lacks } => Ok((pid as i32, lacks)),
        ForkReply::Failed { error } => Err(ForkServerError::ForkFailed { error }),
        ForkReply::Refused { reason } => Err(ForkServerError::Refused { reason }),
        ForkReply::Stale { reason } => Err(ForkServerError::Stale { reason }),
        reply => Err(ForkServerError::Unexpected { reply }),
    }
}

/// An environment as the protocol's messages carry it.
pub(super) fn owned(env: &[(&str, &str)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(super) fn send_with_fds(sock: &UnixStream, body: &[u8], fds: &[i32]) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let len = (body.len() as u32).to_le_bytes();
    let iov = [IoSlice::new(&len)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let sent = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
        .map_err(io::Error::from)?;
    let mut writer = sock;
    if sent < len.len() {
        writer.write_all(&len[sent..])?;
    }
    writer.write_all(body)
}

pub(super) fn read_reply(sock: &mut UnixStream) -> Result<ForkReply, ReplyError> {
    let mut len = [0u8; 4];
    sock.read_exact(&mut len)?;
    let n = u32::from_le_bytes(len) as usize;
    if n > 1 << 20 {
        return Err(ReplyError::TooLarge { bytes: n });
    }
    let mut body = vec![0u8; n];
    sock.read_exact(&mut body)?;
    serde_json::from_slice(&body).map_err(ReplyError::Unreadable)
}
