//! Finding every live process of a stage, from `/proc`.
//!
//! A stage's first process leads a session of its own or a process group of its own in the
//! orchestrator's session (`crate::process::tree` says which). A stage's processes are: its
//! session or group (every descendant that does not leave it shares its id), every descendant
//! of those (found through parent links, which neither `setsid` nor `setpgid` cuts), and every
//! orphan re-parented to the orchestrator (a child subreaper) that is the stage's leftover, with
//! their descendants and the sessions its processes made. The subreaper's view decides, not
//! the orphan's environment: a child of the orchestrator that it did not start (not a stage's
//! first process, not a helper) and that is not in the orchestrator's own process group can
//! only be a stage's escaped process; one in that group is when it carries a live stage's token
//! (a process of a stage led as a group may join the orchestrator's group, which is in the same
//! session). It is the stage's whose token it carries; with no token (a program that `execve`d
//! with an empty environment), it is the stage's that was running when it was born, and when
//! several were, it is claimed by the last of them to end ([`note_stage`]). A token-less
//! process that joined the orchestrator's own group cannot be told from the orchestrator's
//! own short-lived children: only a stage led as a session (where that join is impossible) or
//! its cgroup (which a stage so led always has) holds it. Only the orchestrator's own
//! children have their environment read, so a scan stays cheap on a busy machine. Zombies are
//! not counted: they hold no memory, and the reaper collects them.

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
    /// Process group id.
    pub pgid: i32,
    /// Session id.
    pub sid: i32,
    /// State letter (R, S, D, Z, T...).
    pub state: char,
    /// When it started, in clock ticks since boot (0 when `/proc` did not say).
    pub start: u64,
    /// CPU time it used, user and system, with that of its children it waited for, in clock
    /// ticks (0 when `/proc` did not say).
    pub cpu_ticks: u64,
}

impl ProcStat {
    /// [`ProcStat::cpu_ticks`] in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        // SAFETY: sysconf with a valid name has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
        self.cpu_ticks as f64 / hz as f64
    }
}

/// Parses the content of `/proc/<pid>/stat`. The command name may hold spaces and parentheses,
/// so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let pid = text.split_whitespace().next()?.parse().ok()?;
    let after = &text[text.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgid = fields.next()?.parse().ok()?;
    let sid = fields.next()?.parse().ok()?;
    // Fields 14–17 of stat(5) (utime, stime, cutime, cstime) are the 8th to 11th after the
    // session id; field 22 (starttime) the 16th.
    // Read without allocating: a snapshot parses every process of the machine.
    let (mut start, mut cpu_ticks) = (0, 0);
    for (i, field) in fields.take(16).enumerate() {
        match i {
            7..=10 => cpu_ticks += field.parse::<u64>().unwrap_or(0),
            15 => start = field.parse().unwrap_or(0),
            _ => {}
        }
    }
    Some(ProcStat {
        pid,
        ppid,
        pgid,
        sid,
        state,
        start,
        cpu_ticks,
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

/// Whether process group `pgid` has no process left, zombies included (one `kill` with signal
/// 0: no scan). False when that cannot be told (another user's group).
pub fn group_gone(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let alive = unsafe { libc::kill(-pgid, 0) } == 0;
    !alive && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// The processes of session `sid` now, zombies not reaped yet included (a [`snapshot`]).
pub fn session_pids(sid: i32) -> Vec<i32> {
    snapshot()
        .into_iter()
        .filter(|p| p.sid == sid)
        .map(|p| p.pid)
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
    let mut children = Children::default();
    let mut offset = 0;
    // Small: usually the only child is the guard (a larger buffer cost its zeroing each time).
    let mut chunk = [0u8; 512];
    loop {
        match file.read_at(&mut chunk, offset) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                // Parsed as read, with no copy of the text (a sweep reads it at every stage's
                // end); an entry cut between two reads goes on in the next.
                children.parse(&chunk[..n]);
                offset += n as u64;
                // The kernel fills a read of this file with whole entries ("PID ", at most 12
                // bytes) as far as they fit: one that left more room than an entry needs was
                // the last.
                if n + 32 <= chunk.len() {
                    break;
                }
            }
        }
    }
    children.finish()
}

/// The PIDs of `/proc/self/task/TID/children` as its text comes in: the numbers between
/// ASCII whitespace; a word that is not a PID (which the kernel never writes) is left out.
#[derive(Default)]
struct Children {
    pids: Vec<i32>,
    /// The word being read: its value so far, `None` once it is no PID.
    word: Option<Option<i32>>,
}

impl Children {
    fn parse(&mut self, text: &[u8]) {
        for &b in text {
            if b.is_ascii_whitespace() {
                self.end_word();
            } else {
                let so_far = self.word.unwrap_or(Some(0));
                self.word = Some(so_far.and_then(|v| match b {
                    b'0'..=b'9' => v.checked_mul(10)?.checked_add(i32::from(b - b'0')),
                    _ => None,
                }));
            }
        }
    }

    fn end_word(&mut self) {
        if let Some(Some(pid)) = self.word.take() {
            self.pids.push(pid);
        }
    }

    fn finish(mut self) -> Vec<i32> {
        self.end_word();
        self.pids
    }
}

/// Children of the orchestrator that belong to no stage (the guard, standbys waiting to be
/// adopted): the check for escaped
/// stage processes among the orchestrator's children skips them instead of reading their
/// environment at every stage's end.
static HELPERS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Notes that child `pid` of this process is a helper of the orchestrator (the guard), which
/// the check for escaped stage processes skips for as long as this process lives.
pub fn note_helper(pid: i32) {
    HELPERS.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
}

/// Notes that helper `pid` (see [`note_helper`]) is no longer one: it was killed, or a stage
/// took it over (an adopted standby).
pub fn forget_helper(pid: i32) {
    HELPERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|p| *p != pid);
}

fn is_helper(pid: i32) -> bool {
    HELPERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&pid)
}

/// A stage attempt from its spawn until [`forget_stage`]: its first process, its token and
/// when that process started.
struct LiveStage {
    leader: i32,
    token: String,
    /// Start time of the first process, clock ticks since boot.
    started: u64,
}

static LIVE: std::sync::Mutex<Vec<LiveStage>> = std::sync::Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<LiveStage>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Now, in the clock ticks since boot that `/proc/<pid>/stat` gives a process's start in
/// (`CLOCK_BOOTTIME`, read through the vDSO: no system call). A process created after this
/// call has a start time at least this (the kernel stamps it from the same clock, in the
/// same time namespace, when it creates the process, and both round down to a tick).
pub fn ticks_now() -> u64 {
    static NS_PER_TICK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let per_tick = *NS_PER_TICK.get_or_init(|| {
        // SAFETY: sysconf with a valid name has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        (1_000_000_000 / hz).max(1)
    });
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    (now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64) / per_tick
}

/// Notes that `leader` (a child of this process, not yet reaped) is the first process of a
/// stage attempt with `token`: from now until [`forget_stage`], orphans re-parented to this
/// process that were born after it started may be that stage's ([`stage_members`]).
/// `spawned_after` is a [`ticks_now`] taken before `leader` was created, which then stands for
/// its start time (a stage's start reads no file); without it, its start is read from
/// `/proc` (for a process another one forked, whose start this process did not see coming).
pub fn note_stage(leader: i32, token: &str, spawned_after: Option<u64>) {
    let started = spawned_after.unwrap_or_else(|| {
        crate::process::kernel_file::read(format!("/proc/{leader}/stat"))
            .and_then(|t| parse_stat(&t))
            .map_or(0, |p| p.start)
    });
    live().push(LiveStage {
        leader,
        token: token.to_string(),
        started,
    });
}

/// Notes that the stage attempt whose first process was `leader` is over (every process of
/// it is gone, or was reported as a survivor).
pub fn forget_stage(leader: i32) {
    live().retain(|s| s.leader != leader);
}

/// The session of this process.
fn own_sid() -> i32 {
    static SID: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    // SAFETY: getsid(0) only reads the caller's session id.
    *SID.get_or_init(|| unsafe { libc::getsid(0) })
}

/// The process group of this process.
fn own_pgid() -> i32 {
    static PGID: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    // SAFETY: getpgrp only reads the caller's process group id.
    *PGID.get_or_init(|| unsafe { libc::getpgrp() })
}

/// Whether a process of session `sid` is a stage's for being in it: a session other than this
/// process's own (a stage led as a process group is in ours, and so are the orchestrator's
/// other children).
fn stage_session(sid: i32) -> bool {
    sid != 0 && sid != own_sid()
}

/// Whether child `p` of this process is an orphan of some stage: not a helper and not a live
/// stage's first process, and either outside this process's own process group and session
/// (every stage starts in a session or a process group of its own; the orchestrator's other
/// children stay in its group, or are helpers), or in them but carrying a live stage's token
/// (a process of a stage led as a group in our session may move itself into our group).
fn is_orphan(p: &ProcStat, stages: &[LiveStage]) -> bool {
    if is_helper(p.pid) || stages.iter().any(|s| s.leader == p.pid) {
        return false;
    }
    p.sid != own_sid()
        || p.pgid != own_pgid()
        || token_of(p.pid).is_some_and(|t| stages.iter().any(|s| s.token.as_bytes() == t))
}

/// Adds `p` to a stage's members, and its session to the stage's sessions when it is one.
fn add_member(p: &ProcStat, pids: &mut HashSet<i32>, sids: &mut HashSet<i32>) {
    pids.insert(p.pid);
    if stage_session(p.sid) {
        sids.insert(p.sid);
    }
}

/// The stage token in an orphan's environment, if it has one.
fn token_of(pid: i32) -> Option<Vec<u8>> {
    let prefix = format!("{TOKEN_VAR}=");
    let env = fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|b| *b == 0)
        .find_map(|e| e.strip_prefix(prefix.as_bytes()).map(<[u8]>::to_vec))
}

/// Whether orphan `p` belongs to the stage whose first process is `leader`: it carries that
/// stage's token; or it carries no live stage's token, was born after that stage started, and
/// no other live stage started before it was born (when one did, the last of them to end
/// claims it: an orphan is never left to nobody).
fn claims(p: &ProcStat, leader: i32, token: &str, stages: &[LiveStage]) -> bool {
    let found = token_of(p.pid);
    if found.as_deref() == Some(token.as_bytes()) {
        return true;
    }
    if found.is_some_and(|t| stages.iter().any(|s| s.token.as_bytes() == t)) {
        return false;
    }
    let Some(mine) = stages.iter().find(|s| s.leader == leader) else {
        return false;
    };
    p.start >= mine.started
        && !stages
            .iter()
            .any(|s| s.leader != leader && s.started <= p.start)
}

/// A cheap proof that nothing of the stage is alive, without scanning `/proc`: the stage's
/// process group is empty (so every process that stayed in it is gone), and no child of the
/// orchestrator is an orphan of a stage (an escaped process whose parents all died is
/// re-parented to the orchestrator, a child subreaper; one whose parent lives is reached
/// through that parent, which is then in the group or itself such a child). `false` means
/// "maybe alive": scan.
fn surely_gone(leader: i32) -> bool {
    if !group_gone(leader) {
        return false;
    }
    let children = own_children();
    if children.iter().all(|pid| is_helper(*pid)) {
        return true;
    }
    let stages = live();
    !children.into_iter().any(|pid| {
        crate::process::kernel_file::read(format!("/proc/{pid}/stat"))
            .and_then(|t| parse_stat(&t))
            .is_some_and(|p| p.state != 'Z' && is_orphan(&p, &stages))
    })
}

/// The live (non-zombie) processes of the stage whose first process is `leader` (the leader of
/// a session or of a process group) and whose token is `token`, orphans it claims included
/// (see the module's description). Never includes the calling process.
pub fn stage_members(leader: i32, token: &str) -> Vec<ProcStat> {
    let me = own_pid();
    if surely_gone(leader) {
        return Vec::new();
    }
    let procs = snapshot();
    let stages = live();
    let mut pids: HashSet<i32> = HashSet::new();
    // The sessions whose every process is the stage's: its own when it leads one, and those
    // its processes made. Never ours (a stage led as a group is in it).
    let mut sids: HashSet<i32> = HashSet::new();
    for p in &procs {
        if p.pid == me {
            continue;
        }
        if p.sid == leader
            || p.pgid == leader
            || p.pid == leader
            || (p.ppid == me && is_orphan(p, &stages) && claims(p, leader, token, &stages))
        {
            add_member(p, &mut pids, &mut sids);
        }
    }
    drop(stages);
    // Close over descendants and session-mates of what was found.
    loop {
        let before = pids.len();
        for p in &procs {
            if p.pid != me
                && !pids.contains(&p.pid)
                && (pids.contains(&p.ppid) || sids.contains(&p.sid))
            {
                add_member(p, &mut pids, &mut sids);
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
    fn the_children_file_is_parsed_as_split_whitespace_and_parse_did_in_whatever_reads() {
        let text = "12 345 6789012 2147483647 2147483648 x1 7\n 8 ";
        let expected: Vec<i32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        assert_eq!(expected, [12, 345, 6789012, 2147483647, 7, 8]);
        for cut in 0..=text.len() {
            let mut children = Children::default();
            children.parse(&text.as_bytes()[..cut]);
            children.parse(&text.as_bytes()[cut..]);
            assert_eq!(children.finish(), expected, "cut at {cut}");
        }
        assert!(Children::default().finish().is_empty());
        let mut one = Children::default();
        one.parse(b"42");
        assert_eq!(one.finish(), [42]);
    }

    #[test]
    fn ticks_taken_before_a_spawn_are_at_most_the_childs_start_time() {
        let before = ticks_now();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let stat = fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
        let after = ticks_now();
        let _ = child.kill();
        let _ = child.wait();
        let start = parse_stat(&stat).unwrap().start;
        assert!(
            before <= start && start <= after,
            "{before} <= {start} <= {after}"
        );
    }

    #[test]
    fn parses_names_with_spaces_and_parens() {
        let s = parse_stat(
            "4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 5 1 0 0 20 0 1 0 987654 1",
        )
        .unwrap();
        assert_eq!(
            s,
            ProcStat {
                pid: 4242,
                ppid: 17,
                pgid: 4242,
                sid: 4242,
                state: 'S',
                start: 987654,
                cpu_ticks: 6,
            }
        );
    }

    #[test]
    fn a_group_that_never_existed_is_surely_gone_and_a_live_one_is_found() {
        // PID 2^22 - 1 is above the default pid_max, so no such group exists.
        assert!(surely_gone(4_194_303));
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(!surely_gone(pid));
        assert!(stage_members(pid, "none").iter().any(|p| p.pid == pid));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(surely_gone(pid));
    }

    #[test]
    fn an_orphan_without_a_token_belongs_to_the_stage_running_at_its_birth() {
        // A live process without a stage token in its environment stands for the orphan.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .env_remove(TOKEN_VAR)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let stage = |leader, started| LiveStage {
            leader,
            token: format!("t{leader}"),
            started,
        };
        let orphan = |start| ProcStat {
            pid,
            ppid: own_pid(),
            pgid: pid,
            sid: pid,
            state: 'S',
            start,
            cpu_ticks: 0,
        };
        let both = [stage(1, 100), stage(2, 200)];
        // Born while only stage 1 ran: stage 1's, never stage 2's.
        assert!(claims(&orphan(150), 1, "t1", &both));
        assert!(!claims(&orphan(150), 2, "t2", &both));
        // Born while both ran: neither claims it while the other lives...
        assert!(!claims(&orphan(250), 1, "t1", &both));
        assert!(!claims(&orphan(250), 2, "t2", &both));
        // ...and the last to end does.
        assert!(claims(&orphan(250), 2, "t2", &both[1..]));
        // A stage that is not live claims nothing by birth.
        assert!(!claims(&orphan(250), 3, "t3", &both));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn snapshot_sees_this_process() {
        let me = std::process::id() as i32;
        assert!(snapshot().iter().any(|p| p.pid == me));
    }
}
