//! The one place that collects exit statuses.
//!
//! `orchestrate` is a child subreaper, so orphaned descendants of stages (a daemonized
//! grandchild, a launcher's workers) are re-parented to it and must be reaped here too. A task
//! answers SIGCHLD by reaping every exited child with `waitpid(-1, WNOHANG)` and hands the
//! status of a registered stage process to whoever waits for it; orphans are reaped and noted.

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use tokio::sync::oneshot;

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
    waiters: HashMap<i32, oneshot::Sender<ExitStatus>>,
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
    pub fn watch(&self, pid: i32) -> oneshot::Receiver<ExitStatus> {
        let (tx, rx) = oneshot::channel();
        self.table.borrow_mut().waiters.insert(pid, tx);
        rx
    }

    /// Reaps every child that has exited, now.
    pub fn reap_now(&self) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => self.deliver(pid.as_raw(), ExitStatus::Code(code)),
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    self.deliver(pid.as_raw(), ExitStatus::Signal(sig as i32))
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    }

    fn deliver(&self, pid: i32, status: ExitStatus) {
        match self.table.borrow_mut().waiters.remove(&pid) {
            Some(tx) => {
                let _ = tx.send(status);
            }
            None => tracing::debug!(pid, ?status, "reaped an orphaned descendant"),
        }
    }
}
