//! The one place that collects exit statuses.
//!
//! `orchestrate` is a child subreaper, so orphaned descendants of stages (a daemonized
//! grandchild, a launcher's workers) are re-parented to it and must be reaped here too. A task
//! answers SIGCHLD by reaping every exited child with `waitpid(-1, WNOHANG)` and hands the
//! status of a registered stage process to whoever waits for it; orphans are reaped and noted.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use tokio::sync::oneshot;

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
    waiters: HashMap<i32, oneshot::Sender<Reaped>>,
}

/// Handle to the reaper. Cheap to clone; lives on the orchestrator's single thread.
#[derive(Clone, Default)]
pub struct Reaper {
    table: Rc<RefCell<Table>>,
}

impl Reaper {
    /// Makes the calling process a child subreaper and starts reaping on SIGCHLD.
    /// Must be called inside a tokio `LocalSet` or current-thread runtime.
    pub fn start() -> std::io::Result<Reaper> {
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes plain integer arguments.
        let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        let reaper = Reaper::default();
        let handle = reaper.clone();
        tokio::task::spawn_local(async move {
            loop {
                handle.reap_now();
                if sigchld.recv().await.is_none() {
                    break;
                }
            }
        });
        Ok(reaper)
    }

    /// Registers interest in `pid`'s exit status. Call right after spawning, with no `.await`
    /// in between: the reaper runs on the same thread, so it cannot reap the child first.
    pub fn watch(&self, pid: i32) -> oneshot::Receiver<Reaped> {
        let (tx, rx) = oneshot::channel();
        self.table.borrow_mut().waiters.insert(pid, tx);
        rx
    }

    /// Reaps every child that has exited, now.
    pub fn reap_now(&self) {
        loop {
            let mut status: libc::c_int = 0;
            // SAFETY: an all-zero rusage is a valid value for the kernel to overwrite.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: wait4 writes only into the two out-parameters we own.
            let pid = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG, &mut usage) };
            if pid <= 0 {
                break;
            }
            let exit = if libc::WIFEXITED(status) {
                ExitStatus::Code(libc::WEXITSTATUS(status))
            } else if libc::WIFSIGNALED(status) {
                ExitStatus::Signal(libc::WTERMSIG(status))
            } else {
                continue;
            };
            let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
            let usage = ResourceUsage {
                user_s: seconds(usage.ru_utime),
                system_s: seconds(usage.ru_stime),
                max_rss_bytes: (usage.ru_maxrss.max(0) as u64) * 1024,
            };
            self.deliver(
                pid,
                Reaped {
                    status: exit,
                    usage,
                },
            );
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
