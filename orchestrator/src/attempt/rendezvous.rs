//! A rendezvous port of its own for every stage attempt on this host.
//!
//! torchrun, DeepSpeed's and Accelerate's launchers all default to port 29500 for their
//! rendezvous, so two multi-process stages side by side collide (`EADDRINUSE`). Each attempt
//! is given a port the kernel reports free at that moment (bound and released at once), never
//! one handed to one of the last [`REMEMBERED`] attempts of this process, in `MASTER_PORT`,
//! torchrun's `PET_MASTER_PORT` and the `{master_port}` placeholder. A plan that sets
//! `MASTER_PORT` in a stage's `env` keeps its own.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::Mutex;

/// How many recently given ports are never given again.
pub const REMEMBERED: usize = 4096;

/// The variables naming a stage's rendezvous port (the worker contract's).
pub use protocol::worker::ENV_PORT_VARS as PORT_VARS;

static GIVEN: Mutex<VecDeque<u16>> = Mutex::new(VecDeque::new());

/// A port free on every interface now and not given to a recent attempt. `None` when the
/// kernel will not hand out a port (no free port, no network stack).
pub fn free_port() -> Option<u16> {
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..64 {
        let port = kernel_port()?;
        if !given.contains(&port) {
            if given.len() == REMEMBERED {
                given.pop_front();
            }
            given.push_back(port);
            return Some(port);
        }
    }
    None
}

/// A port the kernel picks for a TCP socket bound to every interface, the socket then closed:
/// `socket`, `bind`, `getsockname`, `close` (a `TcpListener` also sets `SO_REUSEADDR` and
/// listens, two more system calls at every stage's start, which a port that no one binds again
/// for a while does not need; without `SO_REUSEADDR` the kernel also passes over ports still
/// held by connections in `TIME_WAIT`).
fn kernel_port() -> Option<u16> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: socket takes plain flags; the descriptor it returns is owned from here on.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor no one else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: an all-zero sockaddr_in is a valid value (AF_UNSPEC, port 0, 0.0.0.0).
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    addr.sin_family = libc::AF_INET as libc::sa_family_t;
    addr.sin_addr.s_addr = u32::from(Ipv4Addr::UNSPECIFIED).to_be();
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let ptr = (&raw mut addr).cast::<libc::sockaddr>();
    // SAFETY: `ptr` points at a sockaddr_in of `len` bytes, live for both calls.
    let bound = unsafe { libc::bind(socket.as_raw_fd(), ptr, len) } == 0
        && unsafe { libc::getsockname(socket.as_raw_fd(), ptr, &mut len) } == 0;
    bound
        .then(|| u16::from_be(addr.sin_port))
        .filter(|&p| p != 0)
}

/// The port of a stage attempt: the one its plan `env` sets in `MASTER_PORT`, else a
/// [`free_port`] (which the contract then puts in the stage's environment).
pub fn stage_port(plan_env: &std::collections::BTreeMap<String, String>) -> Option<u16> {
    match plan_env.get("MASTER_PORT") {
        Some(p) => p.trim().parse().ok(),
        None => free_port(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashSet};
    use std::net::TcpListener;

    #[test]
    fn ports_given_one_after_another_differ_and_are_free() {
        let ports: Vec<u16> = (0..200).map(|_| free_port().unwrap()).collect();
        let distinct: HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len());
        // Free: a listener can take the last one.
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, *ports.last().unwrap())).unwrap();
    }

    #[test]
    fn a_port_the_plan_sets_is_kept() {
        let env = BTreeMap::from([("MASTER_PORT".to_string(), "23456".to_string())]);
        assert_eq!(stage_port(&env), Some(23456));
        assert!(stage_port(&BTreeMap::new()).is_some());
    }
}
