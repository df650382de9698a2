//! Finding every live process of a stage, from `/proc`.
//!
//! A stage's processes are: its session (the first process is a session leader, so every
//! descendant that does not call `setsid` shares its session id), every descendant of those
//! (found through parent links, which `setsid` does not cut), and every orphan re-parented to
//! the orchestrator (a child subreaper) that carries the stage's token in its environment
//! (a double-forked daemon whose parent already exited), with their descendants and
//! session-mates. Only the orchestrator's own children have their environment read, so a scan
//! stays cheap on a busy machine. Zombies are not counted: they hold no memory, and the reaper
//! collects them.

use std::collections::HashSet;
use std::fs;

/// Environment variable carrying a stage attempt's unique token to all its processes.
pub const TOKEN_VAR: &str = "ORCHESTRATE_STAGE_TOKEN";

/// This process's id, asked of the kernel once: a sweep would ask at every stage's spawn and
/// end (the orchestrator never forks a copy of itself that goes on running its code).
pub fn own_pid() -> i32 {
    static PID: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *PID.get_or_init(|| std::process::id() as i32)
}

/// One process as `/proc/<pid>/stat` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Process id.
    pub pid: i32,
    /// Parent process id.
    pub ppid: i32,
    /// Session id.
    pub sid: i32,
    /// State letter (R, S, D, Z, T...).
    pub state: char,
}

/// Parses the content of `/proc/<pid>/stat`. The command name may hold spaces and parentheses,
/// so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let pid = text.split_whitespace().next()?.parse().ok()?;
    let after = &text[text.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let _pgrp = fields.next()?;
    let sid = fields.next()?.parse().ok()?;
    Some(ProcStat {
        pid,
        ppid,
        sid,
        state,
    })
}

/// Every process visible in `/proc` right now.
pub fn snapshot() -> Vec<ProcStat> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?))
        .collect()
}

/// Whether an entry (`KEY=VALUE`) of the environment process `pid` started with passes
/// `matches`; false when it cannot be read (gone, or another user's).
pub fn environ_any(pid: i32, matches: impl Fn(&[u8]) -> bool) -> bool {
    match fs::read(format!("/proc/{pid}/environ")) {
        Ok(env) => env.split(|b| *b == 0).any(matches),
        Err(_) => false,
    }
}

fn environ_has(pid: i32, needle: &[u8]) -> bool {
    environ_any(pid, |entry| entry == needle)
}

/// The children of the calling process's main thread, from `/proc/self/task/<pid>/children`.
///
/// That is where an orphan re-parented to this process (a child subreaper) lands: the kernel
/// gives it to the first live thread of the reaper's thread group, the main thread, which
/// lives as long as the process. (Children that other threads start themselves are listed
/// under those threads; none of them is a stage's escaped process.)
fn own_children() -> Vec<i32> {
    use std::os::unix::fs::FileExt;
    // Kept open: reading it again from offset 0 lists the children anew, and a sweep asks
    // at every stage's end.
    static CHILDREN: std::sync::OnceLock<Option<fs::File>> = std::sync::OnceLock::new();
    let Some(file) = CHILDREN.get_or_init(|| {
        fs::File::open(format!("/proc/self/task/{}/children", std::process::id())).ok()
    }) else {
        return Vec::new();
    };
    let mut text = Vec::new();
    // Small: usually the only child is the guard (a larger buffer cost its zeroing each time).
    let mut chunk = [0u8; 512];
    loop {
        match file.read_at(&mut chunk, text.len() as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                text.extend_from_slice(&chunk[..n]);
                // The kernel fills a read of this file with whole entries ("PID ", at most 12
                // bytes) as far as they fit: one that left more room than an entry needs was
                // the last (a sweep reads it at every stage's end).
                if n + 32 <= chunk.len() {
                    break;
                }
            }
        }
    }
    String::from_utf8_lossy(&text)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Children of the orchestrator that belong to no stage (the guard): the check for escaped
/// stage processes among the orchestrator's children skips them instead of reading their
/// environment at every stage's end.
static HELPERS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Notes that child `pid` of this process is a helper of the orchestrator (the guard), which
/// the check for escaped stage processes skips for as long as this process lives.
pub fn note_helper(pid: i32) {
    HELPERS.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
}

fn is_helper(pid: i32) -> bool {
    HELPERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&pid)
}

/// A cheap proof that nothing of the stage is alive, without scanning `/proc`: the stage's
/// process group is empty (so every process that stayed in it is gone), and no child of the
/// orchestrator carries the stage's token (an escaped process whose parents all died is
/// re-parented to the orchestrator, a child subreaper; one whose parent lives is reached
/// through that parent, which is then in the group or itself such a child). `false` means
/// "maybe alive": scan.
fn surely_gone(leader: i32, token: &str) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let group_alive = unsafe { libc::kill(-leader, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    if group_alive {
        return false;
    }
    // The token's entry is spelled out only when there is a child to look for it in.
    let mut needle: Option<Vec<u8>> = None;
    !own_children().into_iter().any(|pid| {
        !is_helper(pid)
            && environ_has(
                pid,
                needle.get_or_insert_with(|| format!("{TOKEN_VAR}={token}").into_bytes()),
            )
    })
}

/// The live (non-zombie) processes of the stage whose first process is `leader` (a session
/// leader) and whose token is `token`. Never includes the calling process.
pub fn stage_members(leader: i32, token: &str) -> Vec<ProcStat> {
    let me = own_pid();
    if surely_gone(leader, token) {
        return Vec::new();
    }
    let needle = format!("{TOKEN_VAR}={token}").into_bytes();
    let procs = snapshot();
    let mut pids: HashSet<i32> = HashSet::new();
    let mut sids: HashSet<i32> = HashSet::from([leader]);
    for p in &procs {
        if p.pid == me {
            continue;
        }
        if p.sid == leader || p.pid == leader || (p.ppid == me && environ_has(p.pid, &needle)) {
            pids.insert(p.pid);
            sids.insert(p.sid);
        }
    }
    // Close over descendants and session-mates of what was found.
    loop {
        let before = pids.len();
        for p in &procs {
            if p.pid != me
                && !pids.contains(&p.pid)
                && (pids.contains(&p.ppid) || (sids.contains(&p.sid) && p.sid != 0))
            {
                pids.insert(p.pid);
                sids.insert(p.sid);
            }
        }
        if pids.len() == before {
            break;
        }
    }
    procs
        .into_iter()
        .filter(|p| pids.contains(&p.pid) && p.state != 'Z' && p.state != 'X')
        .collect()
}

/// Resident memory of a process in bytes (`/proc/<pid>/statm`), 0 if it is gone.
pub fn rss_bytes(pid: i32) -> u64 {
    let Ok(text) = fs::read_to_string(format!("/proc/{pid}/statm")) else {
        return 0;
    };
    let pages: u64 = text
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf with a valid name has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    pages * page
}

/// The command name of a process (`/proc/<pid>/comm`), for reports.
pub fn comm(pid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn parses_names_with_spaces_and_parens() {
        let s = parse_stat("4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 100").unwrap();
        assert_eq!(
            s,
            ProcStat {
                pid: 4242,
                ppid: 17,
                sid: 4242,
                state: 'S'
            }
        );
    }

    #[test]
    fn a_group_that_never_existed_is_surely_gone_and_a_live_one_is_found() {
        // PID 2^22 - 1 is above the default pid_max, so no such group exists.
        assert!(surely_gone(4_194_303, "none"));
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(!surely_gone(pid, "none"));
        assert!(stage_members(pid, "none").iter().any(|p| p.pid == pid));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(surely_gone(pid, "none"));
    }

    #[test]
    fn snapshot_sees_this_process() {
        let me = std::process::id() as i32;
        assert!(snapshot().iter().any(|p| p.pid == me));
    }
}
