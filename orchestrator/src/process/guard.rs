//! The guard: a small companion process that kills every stage process if `orchestrate` dies
//! without cleaning up (SIGKILL, a crash, the OOM killer).
//!
//! `PR_SET_PDEATHSIG` covers a stage's first process only; its children would survive the
//! orchestrator. The guard is `orchestrate` itself, started with a hidden subcommand and a pipe
//! on its stdin whose other end only the orchestrator holds. When that pipe reaches end of
//! file, the orchestrator is gone (or finished): the guard SIGKILLs every process whose
//! environment carries a stage token of that orchestrator, until none is left, removes the
//! orchestrator's event-socket directory, and exits.

use crate::process::scan::TOKEN_VAR;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

/// The hidden subcommand that runs the guard.
pub const GUARD_SUBCOMMAND: &str = "__guard";

/// Keeps the guard armed; dropping it (or the process dying) triggers the sweep.
pub struct Guard {
    _child: Child,
}

/// Starts the guard for this process; `cleanup` is a directory it removes after its sweep.
pub fn start(cleanup: Option<&std::path::Path>) -> std::io::Result<Guard> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg(GUARD_SUBCOMMAND)
        .arg(std::process::id().to_string());
    if let Some(dir) = cleanup {
        cmd.arg(dir);
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    // Its own process group: a Ctrl-C at the terminal is for the orchestrator, not the guard.
    cmd.process_group(0);
    let child = cmd.spawn()?;
    // It lives as long as this process: it never holds a stage's token.
    crate::process::scan::note_helper(child.id() as i32);
    Ok(Guard { _child: child })
}

/// The token prefix of every stage process that `orchestrator_pid` started.
pub(crate) fn token_prefix(orchestrator_pid: u32) -> String {
    format!("{TOKEN_VAR}={orchestrator_pid}-")
}

/// Runs the guard: waits for end of file on stdin, then sweeps and removes `cleanup`.
/// Returns the exit status.
pub fn run(orchestrator_pid: u32, cleanup: Option<std::path::PathBuf>) -> i32 {
    let status = sweep_after_eof(orchestrator_pid);
    if let Some(dir) = cleanup.filter(|d| d.is_absolute()) {
        let _ = std::fs::remove_dir_all(dir);
    }
    status
}

fn sweep_after_eof(orchestrator_pid: u32) -> i32 {
    // SAFETY: ignoring terminal signals with SIG_IGN is always sound.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
    let mut sink = [0u8; 64];
    let mut stdin = std::io::stdin();
    while !matches!(stdin.read(&mut sink), Ok(0) | Err(_)) {}
    let prefix = token_prefix(orchestrator_pid).into_bytes();
    for _ in 0..50 {
        let victims = processes_with_env_prefix(&prefix);
        if victims.is_empty() {
            return 0;
        }
        for pid in victims {
            // SAFETY: kill(2) with a PID and a signal number.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    1
}

fn processes_with_env_prefix(prefix: &[u8]) -> Vec<i32> {
    let me = std::process::id() as i32;
    crate::process::scan::snapshot()
        .into_iter()
        .filter(|p| p.pid != me && p.state != 'Z')
        .filter(|p| crate::process::scan::environ_any(p.pid, |e| e.starts_with(prefix)))
        .map(|p| p.pid)
        .collect()
}
