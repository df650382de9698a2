//! A rendezvous port of its own for every stage attempt on this host.
//!
//! torchrun, DeepSpeed's and Accelerate's launchers all default to port 29500 for their
//! rendezvous, so two multi-process stages side by side collide (`EADDRINUSE`). Each attempt
//! is given a port the kernel reports free, never one handed to one of the last
//! [`REMEMBERED`] attempts of this process, in `MASTER_PORT`, torchrun's `PET_MASTER_PORT` and
//! the `{master_port}` placeholder. A plan that sets `MASTER_PORT` in a stage's `env` keeps
//! its own.
//!
//! A port is taken either as the attempt is planned ([`free_port`]: bound and released at
//! once) or ahead of it by the stage-files thread ([`HeldPort`]: bound, and kept bound until
//! the attempt is about to spawn, so that no one else is given it meanwhile), which spares
//! the scheduling thread four system calls per stage.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::sync::Mutex;

/// How many recently given ports are never given again.
pub const REMEMBERED: usize = 4096;

/// The variables naming a stage's rendezvous port (the worker contract's).
pub use protocol::worker::ENV_PORT_VARS as PORT_VARS;

/// The ports given to the last [`REMEMBERED`] attempts: in the order given, and as a set
/// (one bit per port) so that a look costs the same however many there are.
struct Given {
    order: VecDeque<u16>,
    bits: [u64; 1024],
}

impl Given {
    fn contains(&self, port: u16) -> bool {
        self.bits[usize::from(port / 64)] & (1 << (port % 64)) != 0
    }

    /// Records `port` as given, forgetting the oldest beyond [`REMEMBERED`].
    fn add(&mut self, port: u16) {
        if self.order.len() == REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.bits[usize::from(old / 64)] &= !(1 << (old % 64));
            }
        }
        self.order.push_back(port);
        self.bits[usize::from(port / 64)] |= 1 << (port % 64);
    }
}

static GIVEN: Mutex<Given> = Mutex::new(Given {
    order: VecDeque::new(),
    bits: [0; 1024],
});

/// A port free on every interface now and not given to a recent attempt. `None` when the
/// kernel will not hand out a port (no free port, no network stack).
pub fn free_port() -> Option<u16> {
    HeldPort::take().map(|held| held.port)
}

/// A port taken ahead of its attempt: a socket bound to it (never listening), which keeps
/// the kernel from giving the port to anyone else, until this is dropped. Dropped (closed)
/// before the attempt's process is spawned, so that the stage can bind the port.
#[derive(Debug)]
pub struct HeldPort {
    port: u16,
    _socket: OwnedFd,
}

impl HeldPort {
    /// A port free on every interface and not given to a recent attempt, held; `None` as for
    /// [`free_port`].
    pub fn take() -> Option<HeldPort> {
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..64 {
            let (port, socket) = kernel_port()?;
            if !given.contains(port) {
                given.add(port);
                return Some(HeldPort {
                    port,
                    _socket: socket,
                });
            }
        }
        None
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// A port the kernel picks for a TCP socket bound to every interface, with that socket:
/// `socket`, `bind`, `getsockname` (a `TcpListener` also sets `SO_REUSEADDR` and listens, two
/// more system calls, which a port that no one binds again for a while does not need; without
/// `SO_REUSEADDR` the kernel also passes over ports still held by connections in `TIME_WAIT`,
/// and while the socket stays bound no other socket is given the port).
fn kernel_port() -> Option<(u16, OwnedFd)> {
    use std::os::fd::{AsRawFd, FromRawFd};
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
        .map(|port| (port, socket))
}

/// The port of a stage attempt: the one its plan `env` sets in `MASTER_PORT`, else the one
/// `held` for it ahead, else a [`free_port`] (which the contract then puts in the stage's
/// environment).
pub fn stage_port(
    plan_env: &std::collections::BTreeMap<String, String>,
    held: Option<u16>,
) -> Option<u16> {
    match plan_env.get("MASTER_PORT") {
        Some(p) => p.trim().parse().ok(),
        None => held.or_else(free_port),
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
    fn a_held_port_is_no_one_elses_until_dropped() {
        let held = HeldPort::take().unwrap();
        let port = held.port();
        assert!(
            TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_err(),
            "a held port cannot be bound by anyone else"
        );
        assert!((0..50).all(|_| free_port() != Some(port)));
        drop(held);
        // Dropped (as before the attempt's spawn): the stage can bind it.
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).unwrap();
    }

    #[test]
    fn the_recent_ports_forget_only_the_oldest() {
        let mut given = Given {
            order: VecDeque::new(),
            bits: [0; 1024],
        };
        let first = 1000u16;
        for p in first..first + REMEMBERED as u16 {
            given.add(p);
        }
        assert!(given.contains(first) && given.contains(first + REMEMBERED as u16 - 1));
        assert!(!given.contains(first - 1));
        given.add(u16::MAX);
        assert!(!given.contains(first), "the oldest is forgotten");
        assert!(given.contains(first + 1) && given.contains(u16::MAX));
    }

    #[test]
    fn a_port_the_plan_sets_is_kept() {
        let env = BTreeMap::from([("MASTER_PORT".to_string(), "23456".to_string())]);
        assert_eq!(stage_port(&env, Some(34567)), Some(23456));
        assert_eq!(stage_port(&BTreeMap::new(), Some(34567)), Some(34567));
        assert!(stage_port(&BTreeMap::new(), None).is_some());
    }
}
