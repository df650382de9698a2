//! The exit statuses of processes that are not our children (a launcher's ranks, collected by
//! their launcher), from the kernel's process events connector (`NETLINK_CONNECTOR`,
//! `PROC_EVENT_EXIT`). The kernel lets only privileged processes (`CAP_NET_ADMIN`, in the
//! initial network namespace) listen; elsewhere [`ExitLog::start`] says no, and callers read a
//! zombie's status from `/proc` instead.
//!
//! One thread per process listens; only the exits of PIDs someone [`ExitLog::watch`]es are
//! kept, until they are taken or forgotten.

use crate::process::reaper::ExitStatus;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
/// `struct nlmsghdr`, then `struct cn_msg`'s header.
const NLMSG_HDR: usize = 16;
const CN_MSG_HDR: usize = 20;
/// `struct proc_event`: `what`, `cpu`, `timestamp_ns`, then the event.
const PROC_EVENT_HDR: usize = 16;

/// A watched process's exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// How it ended.
    pub status: ExitStatus,
    /// When, in the kernel's monotonic nanoseconds: orders the exits of one log.
    pub at_ns: u64,
}

/// Watched PIDs and the exits of those that exited.
#[derive(Default)]
struct Table {
    watched: HashMap<i32, Option<Exit>>,
}

/// The process's exit log.
#[derive(Clone)]
pub struct ExitLog(Arc<Mutex<Table>>);

impl ExitLog {
    /// The process's log, its listener started on first use; `None` when the kernel does not
    /// let this process listen.
    pub fn start() -> Option<ExitLog> {
        static LOG: OnceLock<Option<ExitLog>> = OnceLock::new();
        LOG.get_or_init(|| {
            let fd = listen_socket()?;
            let log = ExitLog(Arc::default());
            let theirs = log.clone();
            std::thread::Builder::new()
                .name("proc-exits".into())
                .spawn(move || theirs.receive(fd))
                .ok()?;
            Some(log)
        })
        .clone()
    }

    /// Keeps `pid`'s exit status when it exits.
    pub fn watch(&self, pid: i32) {
        self.table().watched.entry(pid).or_insert(None);
    }

    /// `pid`'s exit, if it exited since it was watched (it is forgotten then).
    pub fn take(&self, pid: i32) -> Option<Exit> {
        let mut table = self.table();
        let exit = table.watched.get(&pid).copied().flatten()?;
        table.watched.remove(&pid);
        Some(exit)
    }

    /// Stops watching `pid`.
    pub fn forget(&self, pid: i32) {
        self.table().watched.remove(&pid);
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads exit events for ever.
    fn receive(&self, fd: std::os::fd::OwnedFd) {
        use std::os::fd::AsRawFd;
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reading into a buffer of its length from a socket we own.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            if let Some((pid, exit)) = parse_exit(&buf[..n as usize]) {
                if let Some(slot) = self.table().watched.get_mut(&pid) {
                    *slot = Some(exit);
                }
            }
        }
    }
}

/// A process's exit (not a thread's) in one connector message: its PID and exit.
fn parse_exit(msg: &[u8]) -> Option<(i32, Exit)> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(msg.get(at..at + 4)?.try_into().ok()?))
    };
    let event = NLMSG_HDR + CN_MSG_HDR;
    if word(event)? != PROC_EVENT_EXIT {
        return None;
    }
    // `timestamp_ns` follows `what` and `cpu`.
    let at_ns = u64::from_ne_bytes(msg.get(event + 8..event + 16)?.try_into().ok()?);
    let body = event + PROC_EVENT_HDR;
    let (pid, tgid, code) = (word(body)?, word(body + 4)?, word(body + 8)?);
    if pid != tgid {
        return None;
    }
    let code = code as i32;
    let status = match code & 0x7f {
        0 => ExitStatus::Code((code >> 8) & 0xff),
        sig => ExitStatus::Signal(sig),
    };
    Some((pid as i32, Exit { status, at_ns }))
}

/// A connector socket subscribed to process events, or `None` when refused.
fn listen_socket() -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: plain socket calls on a descriptor we own; the structures are initialised.
    unsafe {
        let raw = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_CONNECTOR,
        );
        if raw < 0 {
            return None;
        }
        let fd = OwnedFd::from_raw_fd(raw);
        let mut addr: libc::sockaddr_nl = std::mem::zeroed();
        addr.nl_family = libc::AF_NETLINK as u16;
        addr.nl_groups = CN_IDX_PROC;
        let bound = libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        );
        if bound != 0 {
            return None;
        }
        let mut msg = Vec::with_capacity(NLMSG_HDR + CN_MSG_HDR + 4);
        let len = (NLMSG_HDR + CN_MSG_HDR + 4) as u32;
        msg.extend_from_slice(&len.to_ne_bytes());
        msg.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
        msg.extend_from_slice(&0u16.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        for word in [CN_IDX_PROC, CN_VAL_PROC, 0, 0] {
            msg.extend_from_slice(&word.to_ne_bytes());
        }
        msg.extend_from_slice(&4u16.to_ne_bytes());
        msg.extend_from_slice(&0u16.to_ne_bytes());
        msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
        let sent = libc::send(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0);
        (sent == msg.len() as isize).then_some(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_of_a_process_that_is_not_ours_to_reap_is_seen_where_the_kernel_allows() {
        let Some(log) = ExitLog::start() else {
            eprintln!("the process events connector is not available here (needs CAP_NET_ADMIN)");
            return;
        };
        // Two grandchildren: their parent `sh` collects them, not us. The later one is
        // started first, so that the order of the exits is not the order of the PIDs.
        let mut parent = std::process::Command::new("sh")
            .args([
                "-c",
                "sh -c 'sleep 0.6; exit 7' & echo $!; sh -c 'sleep 0.3; exit 9' & echo $!; wait",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut reader = std::io::BufReader::new(parent.stdout.take().unwrap());
        let mut pid = || {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
            let pid: i32 = line.trim().parse().unwrap();
            log.watch(pid);
            pid
        };
        let (later, sooner) = (pid(), pid());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let exit = |pid| loop {
            if let Some(exit) = log.take(pid) {
                return exit;
            }
            assert!(std::time::Instant::now() < deadline, "no exit seen");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let (sooner, later) = (exit(sooner), exit(later));
        assert_eq!(sooner.status, ExitStatus::Code(9));
        assert_eq!(later.status, ExitStatus::Code(7));
        assert!(sooner.at_ns < later.at_ns, "{sooner:?} {later:?}");
        parent.wait().unwrap();
    }
}
