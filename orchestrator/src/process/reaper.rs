//! The one place that collects exit statuses.
//!
//! `orchestrate` is a child subreaper, so orphaned descendants of stages (a daemonized
//! grandchild, a launcher's workers) are re-parented to it and must be reaped here too.
//!
//! How a waiter ([`Reaper::watch`]) learns that its process ended depends on how the process
//! was set up:
//! - **One signalfd for every child** (the orchestrator: its `main` calls
//!   [`block_child_signals`] before any thread exists). SIGCHLD stays blocked, so the kernel
//!   queues it for the signalfd, which turns readable in the runtime's `epoll`; the reaper's
//!   task then reads it and reaps every child that has ended, handing each status to its
//!   waiter. Nothing per child: a pidfd cost every stage of a sweep about 6 µs on the path
//!   between one stage's end and the next one's spawn (its file, two `epoll_ctl` calls and a
//!   `close`; measured on the development machine by `bench/overhead/syscalls.py`).
//! - **A pidfd per watched process** otherwise (SIGCHLD not blocked, as in unit tests): it
//!   turns readable when the process ends, and its waiter reaps it.
//!
//! No handler ever runs for SIGCHLD (a handler cost every stage a signal delivery, an
//! interrupted `epoll_wait`, a self-pipe write and two reads). Whatever the mode, everything
//! that has ended is also reaped every `REAP_EVERY` and while a stage's leftovers are being
//! stopped (`crate::process::tree::stop_tree`), and whatever is reaped that someone waits for
//! goes to that waiter.

use crate::fasthash::FastMap;
use std::cell::RefCell;
use std::future::Future;
use std::os::fd::{FromRawFd, OwnedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

/// How often orphaned descendants are reaped when nothing else reaps them.
pub(crate) const REAP_EVERY: Duration = Duration::from_secs(1);

/// What the kernel accounted to a reaped process: its own use and that of the descendants it
/// waited for.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ResourceUsage {
    /// User CPU seconds.
    pub user_s: f64,
    /// System CPU seconds.
    pub system_s: f64,
    /// Largest resident set of any one of those processes, bytes.
    pub max_rss_bytes: u64,
}

/// A reaped process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reaped {
    /// How it ended.
    pub status: ExitStatus,
    /// What it used.
    pub usage: ResourceUsage,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

#[derive(Default)]
struct Table {
    waiters: FastMap<i32, oneshot::Sender<Reaped>>,
    /// Ends are learned from the reaper's signalfd (no pidfd per process).
    by_signal: bool,
}

/// Handle to the reaper. Cheap to clone; lives on the orchestrator's single thread.
#[derive(Clone, Default)]
pub struct Reaper {
    table: Rc<RefCell<Table>>,
}

/// What one `wait4` found.
enum Waited {
    /// This child ended; here is how.
    Ended(i32, Reaped),
    /// Children exist, none has ended (or `pid`'s is still running).
    Running,
    /// No such child (any more).
    NoChild,
}

/// One `wait4(pid, WNOHANG | __WALL)`: any kind of child (a stage's first process cloned
/// without an exit signal is one only `__WALL` sees before it execs).
fn wait_one(pid: i32) -> Waited {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: an all-zero rusage is a valid value for the kernel to overwrite.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 writes only into the two out-parameters we own.
        let got =
            unsafe { libc::wait4(pid, &mut status, libc::WNOHANG | libc::__WALL, &mut usage) };
        if got == 0 {
            return Waited::Running;
        }
        if got < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                _ => return Waited::NoChild,
            }
        }
        let exit = if libc::WIFEXITED(status) {
            ExitStatus::Code(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            ExitStatus::Signal(libc::WTERMSIG(status))
        } else {
            continue; // stopped or continued: not an end
        };
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        let usage = ResourceUsage {
            user_s: seconds(usage.ru_utime),
            system_s: seconds(usage.ru_stime),
            max_rss_bytes: (usage.ru_maxrss.max(0) as u64) * 1024,
        };
        return Waited::Ended(
            got,
            Reaped {
                status: exit,
                usage,
            },
        );
    }
}

/// A pidfd for `pid` (`pidfd_open`, Linux 5.3), close-on-exec.
fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags, and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just gave this process, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Blocks SIGCHLD in the calling thread, and so in every thread it starts from then on. Call
/// first thing in `main`, before any thread exists: [`Reaper::start`] then learns of every
/// child's end from one signalfd (see the module documentation). Children started by
/// [`crate::process::spawn`] and `std::process::Command` begin with no signal blocked.
pub fn block_child_signals() {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset; pthread_sigmask only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// A signalfd for SIGCHLD, registered with the runtime, if this thread blocks SIGCHLD (see
/// [`block_child_signals`]).
fn child_signals() -> Option<AsyncFd<OwnedFd>> {
    // SAFETY: sigset_t is plain data; the calls only read or fill the sets we own.
    let fd = unsafe {
        let mut blocked: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut blocked);
        if libc::sigismember(&blocked, libc::SIGCHLD) != 1 {
            return None;
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC)
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor the kernel just gave this process, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: an OwnedFd's descriptor stays open, the same, until the AsyncFd drops it.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
}

/// Takes the queued SIGCHLD off `fd` (there is at most one: it is not a real-time signal).
fn take_child_signal(fd: &OwnedFd) {
    let mut info = [0u8; 4 * std::mem::size_of::<libc::signalfd_siginfo>()];
    // SAFETY: reading into a buffer we own, of the length given.
    unsafe {
        libc::read(
            std::os::fd::AsRawFd::as_raw_fd(fd),
            info.as_mut_ptr().cast(),
            info.len(),
        )
    };
}

impl Reaper {
    /// Makes the calling process a child subreaper and starts reaping: at every child's end
    /// when SIGCHLD is blocked (see [`block_child_signals`]), and every `REAP_EVERY` in any
    /// case. Must be called inside a tokio `LocalSet` or current-thread runtime.
    pub fn start() -> std::io::Result<Reaper> {
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes plain integer arguments.
        let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let reaper = Reaper::default();
        let signals = child_signals();
        reaper.table.borrow_mut().by_signal = signals.is_some();
        let handle = reaper.clone();
        tokio::task::spawn_local(async move {
            let mut every = tokio::time::interval(REAP_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                match &signals {
                    Some(fd) => tokio::select! {
                        biased;
                        ready = fd.readable() => {
                            if let Ok(mut ready) = ready {
                                take_child_signal(fd.get_ref());
                                // A SIGCHLD queued after the read sets it again at the
                                // runtime's next turn.
                                ready.clear_ready();
                            }
                        }
                        _ = every.tick() => handle.close_lost(),
                    },
                    None => {
                        every.tick().await;
                    }
                }
                handle.reap_now();
            }
        });
        Ok(reaper)
    }

    /// Whether a waiter needs the process's pidfd (`Reaper::watch_pidfd`): false when ends
    /// are learned from the reaper's signalfd.
    pub fn wants_pidfds(&self) -> bool {
        !self.table.borrow().by_signal
    }

    /// Waits for `pid`, a child of this process (or one that will be re-parented to it).
    /// Call right after spawning, with no `.await` in between: the reaper runs on the same
    /// thread, so it cannot reap the child first. Call from inside the runtime.
    pub fn watch(&self, pid: i32) -> ExitWait {
        if self.table.borrow().by_signal {
            return self.waiting(pid, Wake::Reaper);
        }
        match pidfd_open(pid) {
            Ok(fd) => self.watch_pidfd(pid, fd),
            Err(_) => self.waiting(pid, Wake::poll()),
        }
    }

    /// Ends the wait of every waiter whose process is gone without having been reaped here (it
    /// never was a child of this process): their waits resolve to `None`.
    fn close_lost(&self) {
        let pids: Vec<i32> = self.table.borrow().waiters.keys().copied().collect();
        for pid in pids {
            // SAFETY: signal 0 only checks that the process exists.
            let gone = unsafe { libc::kill(pid, 0) } != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            if gone && !self.reap(pid) {
                self.table.borrow_mut().waiters.remove(&pid);
            }
        }
    }

    /// [`Reaper::watch`] with the child's pidfd already in hand (from `clone3`).
    pub(crate) fn watch_pidfd(&self, pid: i32, pidfd: OwnedFd) -> ExitWait {
        // SAFETY: an OwnedFd's descriptor stays open, the same, until the AsyncFd drops it.
        let registered =
            unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) };
        let wake = match registered {
            Ok(fd) => Wake::Pidfd(fd),
            // The runtime would not take it (out of memory): look every few milliseconds.
            Err(_) => Wake::poll(),
        };
        self.waiting(pid, wake)
    }

    fn waiting(&self, pid: i32, wake: Wake) -> ExitWait {
        let (tx, rx) = oneshot::channel();
        self.table.borrow_mut().waiters.insert(pid, tx);
        ExitWait {
            rx,
            wake,
            pid,
            reaper: self.clone(),
        }
    }

    /// Reaps every child that has ended, now, handing each status to its waiter.
    pub(crate) fn reap_now(&self) {
        while let Waited::Ended(pid, reaped) = wait_one(-1) {
            self.deliver(pid, reaped);
        }
    }

    /// Reaps `pid` if it has ended; false when it is no child (any more).
    fn reap(&self, pid: i32) -> bool {
        match wait_one(pid) {
            Waited::Ended(pid, reaped) => {
                self.deliver(pid, reaped);
                true
            }
            Waited::Running => true,
            Waited::NoChild => false,
        }
    }

    fn deliver(&self, pid: i32, reaped: Reaped) {
        match self.table.borrow_mut().waiters.remove(&pid) {
            Some(tx) => {
                let _ = tx.send(reaped);
            }
            None => tracing::debug!(pid, ?reaped, "reaped an orphaned descendant"),
        }
    }
}

/// What tells a waiter to look.
enum Wake {
    /// The reaper's own task, which reaps at every SIGCHLD and hands the status over.
    Reaper,
    /// The process's pidfd, readable once it has ended.
    Pidfd(AsyncFd<OwnedFd>),
    /// A look every few milliseconds (no pidfd to be had).
    Poll(tokio::time::Interval),
}

impl Wake {
    fn poll() -> Wake {
        Wake::Poll(tokio::time::interval(Duration::from_millis(5)))
    }
}

/// The end of one watched process: its status once it has ended and been reaped, `None` when
/// it cannot be had (the process is no child of this one, or the reaper is gone). Dropping
/// it stops the watch; the process is then reaped as an orphan would be.
pub struct ExitWait {
    rx: oneshot::Receiver<Reaped>,
    wake: Wake,
    pid: i32,
    reaper: Reaper,
}

impl std::fmt::Debug for ExitWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match self.wake {
            Wake::Reaper => "signalfd",
            Wake::Pidfd(_) => "pidfd",
            Wake::Poll(_) => "polling",
        };
        write!(f, "ExitWait(pid {}, {how})", self.pid)
    }
}

impl ExitWait {
    /// The status if the process has ended (reaping it if need be): `Some(None)` when it
    /// cannot be had, `None` while it runs. Does not block.
    pub(crate) fn try_wait(&mut self) -> Option<Option<Reaped>> {
        check(&mut self.rx, &self.reaper, self.pid)
    }
}

/// [`ExitWait::try_wait`] on its parts.
fn check(rx: &mut oneshot::Receiver<Reaped>, reaper: &Reaper, pid: i32) -> Option<Option<Reaped>> {
    use oneshot::error::TryRecvError;
    match rx.try_recv() {
        Ok(reaped) => return Some(Some(reaped)),
        Err(TryRecvError::Closed) => return Some(None),
        Err(TryRecvError::Empty) => {}
    }
    let child = reaper.reap(pid);
    match rx.try_recv() {
        Ok(reaped) => Some(Some(reaped)),
        Err(TryRecvError::Closed) => Some(None),
        Err(TryRecvError::Empty) if !child => Some(None),
        Err(TryRecvError::Empty) => None,
    }
}

impl Future for ExitWait {
    type Output = Option<Reaped>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Reaped>> {
        let ExitWait {
            rx,
            wake,
            pid,
            reaper,
        } = &mut *self;
        loop {
            if let Poll::Ready(result) = Pin::new(&mut *rx).poll(cx) {
                return Poll::Ready(result.ok());
            }
            match wake {
                // The reaper's task sends the status when it reaps it.
                Wake::Reaper => return Poll::Pending,
                Wake::Pidfd(fd) => {
                    let readable = std::task::ready!(fd.poll_read_ready(cx)).is_ok();
                    // Readable: it ended. Reaped here, or already by `reap_now`.
                    if readable {
                        if let Some(done) = check(rx, reaper, *pid) {
                            return Poll::Ready(done);
                        }
                    }
                    // Not reapable yet (or the runtime failed us): look every few
                    // milliseconds from now on rather than wait for an edge that came.
                    *wake = Wake::poll();
                }
                Wake::Poll(every) => {
                    std::task::ready!(every.poll_tick(cx));
                    if let Some(done) = check(rx, reaper, *pid) {
                        return Poll::Ready(done);
                    }
                }
            }
        }
    }
}

impl Drop for ExitWait {
    fn drop(&mut self) {
        self.reaper.table.borrow_mut().waiters.remove(&self.pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A current-thread runtime, as the orchestrator's. (No `Reaper::start`: its reaping of
    /// every child would take other tests' children in this process.)
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_watched_child_ends_through_its_pidfd_with_no_sigchld_handler() {
        let runtime = runtime();
        let reaper = Reaper::default();
        runtime.block_on(async {
            // Cloned with a pidfd, as a stage's first process is.
            let null = std::fs::File::open("/dev/null").unwrap();
            let argv = ["sh", "-c", "sleep 0.2; exit 3"].map(String::from);
            let spawned = crate::process::spawn::spawn(&crate::process::spawn::Request {
                argv: &argv,
                env: &[("PATH", "/usr/bin:/bin")],
                env_base: None,
                cwd: std::path::Path::new("/"),
                stdin: std::os::fd::AsFd::as_fd(&null),
                stdout: std::os::fd::AsFd::as_fd(&null),
                stderr: std::os::fd::AsFd::as_fd(&null),
                pidfd: true,
                cgroup_procs: None,
                cgroup_dir: None,
                cgroup_namespace: false,
                leads: crate::process::spawn::Leads::Session,
            })
            .unwrap();
            let pidfd = spawned.pidfd.expect("clone3 gives a pidfd");
            let mut exit = reaper.watch_pidfd(spawned.pid, pidfd);
            assert!(exit.try_wait().is_none(), "still running");
            let reaped = tokio::time::timeout(Duration::from_secs(10), &mut exit)
                .await
                .expect("the pidfd woke the waiter")
                .expect("reaped");
            assert_eq!(reaped.status, ExitStatus::Code(3));
            // Reaped: no such child any more.
            assert!(matches!(wait_one(spawned.pid), Waited::NoChild));

            // A child started elsewhere, watched through `pidfd_open`.
            // Reaped here, not by `Child::wait`.
            #[allow(clippy::zombie_processes)]
            let child = std::process::Command::new("sh")
                .args(["-c", "kill -TERM $$"])
                .spawn()
                .unwrap();
            let pid = child.id() as i32;
            let reaped = tokio::time::timeout(Duration::from_secs(10), reaper.watch(pid))
                .await
                .expect("woken")
                .expect("reaped");
            assert_eq!(reaped.status, ExitStatus::Signal(libc::SIGTERM));
        });
    }
}
