//! A rendezvous port of its own for every stage attempt on this host.
//!
//! torchrun, DeepSpeed's and Accelerate's launchers all default to port 29500 for their
//! rendezvous, so two multi-process stages side by side collide (`EADDRINUSE`). Each attempt
//! is given a port the kernel reports free at that moment (bound and released at once), never
//! one handed to one of the last [`REMEMBERED`] attempts of this process, in `MASTER_PORT`,
//! torchrun's `PET_MASTER_PORT` and the `{master_port}` placeholder. A plan that sets
//! `MASTER_PORT` in a stage's `env` keeps its own.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// How many recently given ports are never given again.
pub const REMEMBERED: usize = 4096;

/// The variables naming a stage's rendezvous port.
pub const PORT_VARS: [&str; 2] = ["MASTER_PORT", "PET_MASTER_PORT"];

static GIVEN: Mutex<VecDeque<u16>> = Mutex::new(VecDeque::new());

/// A port free on every interface now and not given to a recent attempt. `None` when the
/// kernel will not hand out a port (no free port, no network stack).
pub fn free_port() -> Option<u16> {
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..64 {
        let port = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))
            .and_then(|l| l.local_addr())
            .ok()?
            .port();
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
