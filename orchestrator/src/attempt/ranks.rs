//! Rank failure: when one process of a multi-process stage (the ranks a launcher such as
//! `torchrun`, `accelerate launch`, `deepspeed` or `mpirun` starts, or a script's own workers)
//! exits non-zero, its peers are typically left waiting in a collective until the stage's
//! timeout. The stage's `rank_grace` after such an exit, whatever of it still runs is stopped.
//!
//! A process of the stage's tree is a rank when its environment names one (`RANK`, else
//! `OMPI_COMM_WORLD_RANK` or `PMI_RANK`); the stage's first process is never one (its exit is
//! seen directly). Ranks are found as the tree is sampled; a rank's exit comes from the
//! kernel's process events where orchestrate may listen to them (root, or `CAP_NET_ADMIN`:
//! [`crate::process::exits`]), else from its `/proc` entry while it is a zombie (its launcher
//! has not collected it yet), so that an exit its launcher collects between two looks is then
//! not seen. `torchrun` names the
//! failed rank itself (its "Root Cause" block on stderr), which [`from_torchrun`] reads.
//!
//! Stages run through `srun` are outside this watch: `srun --kill-on-bad-exit` stops the
//! other tasks at once, and each task's record names its rank and exit.

use crate::process::exits::ExitLog;
use crate::process::reaper::ExitStatus;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The grace when neither the stage nor the run sets `rank_grace`.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// How often known ranks are looked at, once a stage has two.
pub const LOOK_PERIOD: Duration = Duration::from_millis(20);

/// A rank that ended badly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankExit {
    /// Its rank.
    pub rank: u32,
    /// Its PID, when it was seen here.
    pub pid: Option<i32>,
    /// How it ended.
    pub status: ExitStatus,
}

impl RankExit {
    /// "rank 1 exited with code 1", "rank 0 was killed by SIGSEGV".
    pub fn describe(&self) -> String {
        match self.status {
            ExitStatus::Code(code) => format!("rank {} exited with code {code}", self.rank),
            ExitStatus::Signal(sig) => format!(
                "rank {} was killed by {}",
                self.rank,
                crate::process::tree::signal_name(sig)
            ),
        }
    }
}

/// The ranks of one attempt, as far as they were seen.
#[derive(Debug, Default)]
pub struct RankWatch {
    /// Live ranks by PID.
    ranks: BTreeMap<i32, u32>,
    /// PIDs whose environment was read.
    looked: BTreeSet<i32>,
    /// The first rank that ended badly.
    failed: Option<RankExit>,
}

impl RankWatch {
    /// Takes in the stage's processes now (`leader` is its first process): the ranks among
    /// those not looked at before.
    pub fn discover(&mut self, leader: i32, members: impl IntoIterator<Item = i32>) {
        for pid in members {
            if pid == leader || self.looked.contains(&pid) {
                continue;
            }
            let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
                continue;
            };
            // Empty while it is being exec'd: looked at again next time.
            if env.is_empty() {
                continue;
            }
            self.looked.insert(pid);
            if let Some(rank) = rank_of(&env) {
                self.ranks.insert(pid, rank);
                if let Some(log) = ExitLog::start() {
                    log.watch(pid);
                }
            }
        }
    }

    /// Whether ranks are worth looking at: two or more were seen and none failed yet.
    pub fn watching(&self) -> bool {
        self.failed.is_none() && self.ranks.len() >= 2
    }

    /// Looks at each known rank: the first that ended badly (a zombie with a non-zero status,
    /// or an exit the kernel reported) is returned, once; ranks that are gone are forgotten.
    ///
    /// Several bad exits seen in one look (a loaded machine looks late) are told apart so that
    /// the cause is named, not its consequence: by the kernel's exit times when it gave them
    /// all; else an exit by code or by a fault (the OOM killer's `SIGKILL` among them) comes
    /// before a death by a stop signal (`SIGTERM`, `SIGINT`: what a launcher sends the other
    /// ranks once one failed).
    pub fn look(&mut self) -> Option<RankExit> {
        let mut gone = Vec::new();
        let mut bad = Vec::new();
        for (&pid, &rank) in &self.ranks {
            let zombie = match zombie_status(pid) {
                Seen::Running => continue,
                Seen::Zombie(status) => Some(status),
                Seen::Gone => None,
            };
            gone.push(pid);
            // The kernel's record, where it may be listened to: the status of an exit its
            // launcher already collected, and the time of every exit.
            let logged = ExitLog::start().and_then(|log| log.take(pid));
            let Some(status) = zombie.or(logged.map(|exit| exit.status)) else {
                continue;
            };
            if status != ExitStatus::Code(0) {
                let exit = RankExit {
                    rank,
                    pid: Some(pid),
                    status,
                };
                bad.push((exit, logged.map(|exit| exit.at_ns)));
            }
        }
        for pid in gone {
            self.ranks.remove(&pid);
            forget(pid);
        }
        if self.failed.is_none() {
            self.failed = the_cause(bad);
        }
        self.failed.clone()
    }

    /// The first rank that ended badly, if one was seen.
    pub fn failed(&self) -> Option<&RankExit> {
        self.failed.as_ref()
    }
}

impl Drop for RankWatch {
    fn drop(&mut self) {
        for &pid in self.ranks.keys() {
            forget(pid);
        }
    }
}

/// Stops keeping `pid`'s exit.
fn forget(pid: i32) {
    if let Some(log) = ExitLog::start() {
        log.forget(pid);
    }
}

/// A process's rank, from its environment (`/proc/PID/environ`).
fn rank_of(env: &[u8]) -> Option<u32> {
    let mut found = None;
    for entry in env.split(|b| *b == 0) {
        for (name, weight) in [
            (&b"RANK="[..], 0),
            (b"OMPI_COMM_WORLD_RANK=", 1),
            (b"PMI_RANK=", 2),
        ] {
            if let Some(value) = entry.strip_prefix(name) {
                let rank = std::str::from_utf8(value).ok()?.parse().ok()?;
                if found.is_none_or(|(w, _)| weight < w) {
                    found = Some((weight, rank));
                }
            }
        }
    }
    found.map(|(_, rank)| rank)
}

/// What `/proc` shows of a process: running, gone, or a zombie with its wait status.
enum Seen {
    Running,
    Gone,
    Zombie(ExitStatus),
}

/// Of the bad exits seen in one look (each with the kernel's exit time, when it gave one), the
/// cause: the first by time when every time is known; else an exit by code or fault before a
/// death by a stop signal, then by time.
fn the_cause(mut bad: Vec<(RankExit, Option<u64>)>) -> Option<RankExit> {
    if bad.iter().all(|(_, at_ns)| at_ns.is_some()) {
        bad.sort_by_key(|(_, at_ns)| *at_ns);
    } else {
        bad.sort_by_key(|(exit, at_ns)| (is_stop_signal(exit.status), at_ns.unwrap_or(u64::MAX)));
    }
    bad.into_iter().next().map(|(exit, _)| exit)
}

/// Whether a rank was stopped from outside (by its launcher, most often, once a peer failed)
/// rather than ending of itself. Not `SIGKILL`: a launcher sends it only after a grace, and
/// the OOM killer's is a cause.
pub fn is_stop_signal(status: ExitStatus) -> bool {
    matches!(status, ExitStatus::Signal(sig) if sig == libc::SIGTERM || sig == libc::SIGINT)
}

/// A zombie's wait status is field 52 of `/proc/PID/stat` (Linux 3.5 and later).
fn zombie_status(pid: i32) -> Seen {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Seen::Gone;
    };
    let Some(after) = text.rfind(')').map(|i| &text[i + 1..]) else {
        return Seen::Gone;
    };
    let mut fields = after.split_whitespace();
    if fields.next() != Some("Z") {
        return Seen::Running;
    }
    // Field 3 was the state; field 52 is the 49th after it.
    match fields.nth(48).and_then(|f| f.parse::<i32>().ok()) {
        Some(status) => Seen::Zombie(wait_status(status)),
        None => Seen::Gone,
    }
}

/// A `waitpid` status as an exit.
fn wait_status(status: i32) -> ExitStatus {
    match status & 0x7f {
        0 => ExitStatus::Code((status >> 8) & 0xff),
        sig => ExitStatus::Signal(sig),
    }
}

/// The failed rank `torchrun` names in its "Root Cause" block on stderr, in `stderr_tail`.
pub fn from_torchrun(stderr_tail: &str) -> Option<RankExit> {
    let cause = &stderr_tail[stderr_tail.find("Root Cause")?..];
    let field = |name: &str| {
        cause
            .lines()
            .find_map(|l| l.trim().strip_prefix(name)?.trim().strip_prefix(':'))
            .map(str::trim)
    };
    let rank = field("rank")?.split_whitespace().next()?.parse().ok()?;
    let code: i32 = field("exitcode")?.split_whitespace().next()?.parse().ok()?;
    let status = match code {
        c if c < 0 => ExitStatus::Signal(-c),
        c => ExitStatus::Code(c),
    };
    Some(RankExit {
        rank,
        pid: None,
        status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torchruns_root_cause_names_the_rank_and_its_exit() {
        let tail = "[1]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 26416)\n\
                    ----\nRoot Cause (first observed failure):\n[0]:\n  time      : 2026-12-04_15:38:36\n\
                    \x20 host      : localhost\n  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 26417)\n";
        let exit = from_torchrun(tail).unwrap();
        assert_eq!(exit.describe(), "rank 1 exited with code 1");
        assert_eq!(from_torchrun("no such block"), None);
    }

    /// A process with rank `rank` in its environment, running `script`, in a group of its own.
    fn rank(rank: &str, script: &str) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sh")
            .args(["-c", script])
            .env("RANK", rank)
            .process_group(0)
            .spawn()
            .unwrap()
    }

    /// A watch that has found every one of `ranks` (looked for until their environment can be
    /// read).
    fn watching(ranks: &[&std::process::Child]) -> RankWatch {
        let mut watch = RankWatch::default();
        while watch.ranks.len() < ranks.len() {
            watch.discover(0, ranks.iter().map(|c| c.id() as i32));
        }
        watch
    }

    /// Waits until `child` has exited (a zombie: not collected yet).
    fn until_zombie(child: &std::process::Child) {
        while !matches!(zombie_status(child.id() as i32), Seen::Zombie(_)) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn signal(child: &std::process::Child, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
    }

    #[test]
    fn a_rank_is_read_from_the_environment_and_a_zombies_status_from_proc() {
        let mut child = rank("5", "sleep 0.5; exit 3");
        let mut watch = watching(&[&child]);
        // Not collected yet: it is a zombie once it has exited.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(exit) = watch.look() {
                assert_eq!(exit.rank, 5);
                assert_eq!(exit.status, ExitStatus::Code(3));
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no exit seen");
            std::thread::sleep(Duration::from_millis(5));
        }
        child.wait().unwrap();
    }

    #[test]
    fn of_two_bad_exits_seen_in_one_look_the_cause_is_named_not_the_rank_stopped_after_it() {
        // As under a launcher on a loaded machine: rank 1 exits 1, then rank 0 is stopped by
        // SIGTERM, and both have ended by the time the ranks are looked at. Rank 0 is started
        // first, so its PID is the lower.
        let mut stopped = rank("0", "exec sleep 30");
        let mut failing = rank("1", "sleep 0.2; exit 1");
        let mut watch = watching(&[&stopped, &failing]);
        until_zombie(&failing);
        signal(&stopped, nix::sys::signal::Signal::SIGTERM);
        until_zombie(&stopped);
        let exit = watch.look().expect("a bad exit is seen");
        assert_eq!(exit.describe(), "rank 1 exited with code 1");
        stopped.wait().unwrap();
        failing.wait().unwrap();
    }

    #[test]
    fn a_rank_killed_first_is_named_before_the_peer_that_failed_after_it() {
        // As when the OOM killer takes rank 0 and rank 1's collective fails after it: rank 0
        // dies of SIGKILL, then rank 1 ends badly (an unhandled SIGUSR1 stands for its own
        // failure), both seen in one look.
        let mut killed = rank("0", "exec sleep 30");
        let mut failing = rank("1", "exec sleep 30");
        let mut watch = watching(&[&killed, &failing]);
        signal(&killed, nix::sys::signal::Signal::SIGKILL);
        until_zombie(&killed);
        signal(&failing, nix::sys::signal::Signal::SIGUSR1);
        until_zombie(&failing);
        let exit = watch.look().expect("a bad exit is seen");
        assert_eq!(exit.describe(), "rank 0 was killed by SIGKILL");
        killed.wait().unwrap();
        failing.wait().unwrap();
    }
}
