//! The process tree of one placed stage instance on its node ([`super::placement`]), as the
//! per-task wrapper (`super::task`) keeps it: the command leads a session of its own, the
//! wrapper is the subreaper of everything it starts, and when the command ends every process
//! left of it is killed and reaped before the wrapper records the end and checks the node's
//! GPUs — the same promise a stage run on the orchestrator's own host has.

use crate::process::scan;
use protocol::report::NodeGpuCheck;
use std::path::Path;
use std::process::{Command, Stdio};

/// Makes `cmd` start in a session of its own, and this process the subreaper of its tree.
pub(crate) fn own_session(cmd: &mut Command) {
    // SAFETY: prctl on this process; the argument is a constant.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    // SAFETY: the closure runs between fork and exec and calls only setsid.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Kills (SIGKILL) every process of the session `leader` led and every child of this process,
/// and reaps them, until this process has no child left. The command itself (`leader`) has
/// been reaped already.
pub(crate) fn kill_and_reap(leader: i32) {
    let me = scan::own_pid();
    loop {
        for p in scan::snapshot() {
            if p.pid != me && (p.sid == leader || p.ppid == me) {
                // SAFETY: signalling a process of the instance's tree.
                unsafe { libc::kill(p.pid, libc::SIGKILL) };
            }
        }
        // SAFETY: waiting for any child of this process.
        let reaped = unsafe { libc::waitpid(-1, std::ptr::null_mut(), 0) };
        if reaped < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // ECHILD: nothing of the tree is left (its other members, if any, were children
            // of children, now reparented to us and killed in the next round before this).
            if scan::snapshot().iter().any(|p| p.sid == leader) {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            return;
        }
    }
}

/// Runs `orchestrate gpu-check --json` on this node (with `--max-used-mib max_used_mib`, if
/// given) and saves its verdict, named for `node`, where the stage's report reads the node
/// checks of `stage_dir`.
pub(crate) fn check_gpus(stage_dir: &Path, node: &str, max_used_mib: Option<&str>) {
    let mut cmd = Command::new(super::hidden_args::orchestrate_exe());
    cmd.args(["gpu-check", "--json"]);
    if let Some(limit) = max_used_mib {
        cmd.args(["--max-used-mib", limit]);
    }
    let check = match cmd.stdin(Stdio::null()).output() {
        Ok(out) => {
            use std::os::unix::process::ExitStatusExt;
            let status = match (out.status.code(), out.status.signal()) {
                (Some(c), _) => Some(crate::process::reaper::ExitStatus::Code(c)),
                (None, Some(s)) => Some(crate::process::reaper::ExitStatus::Signal(s)),
                _ => None,
            };
            super::node_check::verdict(
                node.to_string(),
                &String::from_utf8_lossy(&out.stdout),
                &String::from_utf8_lossy(&out.stderr),
                status,
            )
        }
        Err(e) => NodeGpuCheck {
            node: node.to_string(),
            verdict: protocol::status::NodeVerdict::Failed,
            detail: format!("`orchestrate gpu-check` could not be started: {e}"),
        },
    };
    if let Ok(bytes) = serde_json::to_vec_pretty(&[check]) {
        let _ = crate::store::rundir::write_atomic(
            &super::records::node_checks_path(stage_dir),
            &bytes,
        );
    }
}
