//! The per-task wrapper of a stage run through `srun`: `orchestrate __slurm-task --records DIR
//! -- PROGRAM ARGS…`, started by srun once per task.
//!
//! It gives the program the environment torch.distributed launchers expect, from what srun
//! set: `RANK` (`SLURM_PROCID`), `LOCAL_RANK` (`SLURM_LOCALID`), `WORLD_SIZE`
//! (`SLURM_NTASKS`), `LOCAL_WORLD_SIZE`, `NODE_RANK` (`SLURM_NODEID`), `MASTER_ADDR` (the first
//! node of the step) and `MASTER_PORT` (chosen by the orchestrator); variables already set
//! are kept. Only rank 0 keeps the orchestrator's event channel, so events come from rank 0.
//! The wrapper runs the program as its child (Slurm's signals to the step reach both; the
//! wrapper outlives them), names the job step in `DIR/step` for the launcher
//! (`launch`), writes `DIR/rank-<RANK>.json` (a [`protocol::report::TaskRecord`]) when the
//! program ends, and exits as the program did — except while the step is being stopped (the
//! wrapper got SIGTERM or SIGINT): then it exits 0 whatever the program did. srun runs the step
//! with `--kill-on-bad-exit`, and a task that has written its checkpoint and exits with its
//! resumable code must not have srun start ending the tasks still writing theirs (Slurm's
//! SIGKILL follows after its `KillWait`, which may be shorter than the run's grace period). The
//! program's real exit is in its record, which the launcher reports.

use protocol::report::TaskRecord;
use protocol::worker::ENV_EVENTS;
use std::path::PathBuf;
use std::process::Command;

use super::hidden_args::{ENV_PLACED, TASK_SUBCOMMAND};
use super::host_name;

/// The first host of a Slurm host list (`gpu[01-04,07],cpu1` → `gpu01`).
pub fn first_host(list: &str) -> Option<String> {
    let mut depth = 0;
    let end = list
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                ',' if depth == 0 => return true,
                _ => {}
            }
            false
        })
        .map_or(list.len(), |(i, _)| i);
    let first = list[..end].trim();
    if first.is_empty() {
        return None;
    }
    match (first.find('['), first.find(']')) {
        (Some(open), Some(close)) if open < close => {
            let inner = &first[open + 1..close];
            let lowest = inner.split([',', '-']).next().unwrap_or("");
            Some(format!("{}{lowest}{}", &first[..open], &first[close + 1..]))
        }
        _ => Some(first.to_string()),
    }
}

/// Set when a stop signal reached the wrapper: the step is being stopped.
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn outlive(signal: libc::c_int) {
    if signal == libc::SIGTERM || signal == libc::SIGINT {
        STOPPING.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Runs the wrapper with its arguments (after the subcommand) and returns the exit status.
pub fn run(args: Vec<String>) -> i32 {
    let (records, program) = match super::hidden_args::parse(TASK_SUBCOMMAND, args) {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    let (exe, exe_args) = program.split_first().expect("hidden_args::parse checks it");
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let num = |k: &str| var(k).and_then(|v| v.parse::<u32>().ok());
    let rank = num("SLURM_PROCID").unwrap_or(0);
    let local_rank = num("SLURM_LOCALID").unwrap_or(0);
    let world = num("SLURM_NTASKS")
        .or_else(|| num("SLURM_NPROCS"))
        .unwrap_or(1);
    let nodes = num("SLURM_STEP_NUM_NODES")
        .or_else(|| num("SLURM_NNODES"))
        .unwrap_or(1);
    let node = var("SLURMD_NODENAME").unwrap_or_else(host_name);
    let placed = var(ENV_PLACED).is_some_and(|v| v == "1");
    let mut cmd = Command::new(exe);
    cmd.args(exe_args);
    cmd.env_remove(ENV_PLACED);
    if placed {
        super::step_tree::own_session(&mut cmd);
    }
    let mut set_default = |k: &str, v: String| {
        if var(k).is_none() {
            cmd.env(k, v);
        }
    };
    set_default("RANK", rank.to_string());
    set_default("LOCAL_RANK", local_rank.to_string());
    set_default("WORLD_SIZE", world.to_string());
    set_default(
        "LOCAL_WORLD_SIZE",
        (world / nodes.max(1)).max(1).to_string(),
    );
    set_default("NODE_RANK", num("SLURM_NODEID").unwrap_or(0).to_string());
    let master = var("SLURM_STEP_NODELIST")
        .or_else(|| var("SLURM_JOB_NODELIST"))
        .and_then(|l| first_host(&l))
        .unwrap_or_else(|| node.clone());
    set_default("MASTER_ADDR", master);
    set_default("MASTER_PORT", "29500".into());
    if rank != 0 {
        cmd.env_remove(ENV_EVENTS);
    }
    // A placed instance's events go to the batch node over the step's stdout.
    let relay = match (placed && rank == 0, var(ENV_EVENTS)) {
        (true, Some(_)) => match super::relay::NodeEnd::listen() {
            Ok((end, socket)) => {
                cmd.env(ENV_EVENTS, socket);
                Some(end)
            }
            Err(e) => {
                eprintln!("orchestrate {TASK_SUBCOMMAND}: cannot listen for the stage's events on this node ({e}): they are not relayed");
                cmd.env_remove(ENV_EVENTS);
                None
            }
        },
        _ => None,
    };
    if let Some(dir) = &records {
        // Named before the command starts, so a step lost on this node names it.
        super::lost::note_node(dir, rank, &node);
    }
    if let (Some(dir), Some(job), Some(step)) =
        (&records, var("SLURM_JOB_ID"), var("SLURM_STEP_ID"))
    {
        // The launcher stops the step by this name (see `launch`).
        let _ = std::fs::create_dir_all(dir).and_then(|()| {
            std::fs::write(
                dir.join(super::records::STEP_FILE),
                format!("{job}.{step}\n"),
            )
        });
    }
    // Slurm signals every process of the step, the program included; the wrapper only has to
    // outlive it to record how it ended. Caught from before the program starts, so that no stop
    // can end the wrapper first.
    for signal in [
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ] {
        // SAFETY: `outlive` only stores to an atomic; a caught signal is reset to default in
        // the child at exec.
        unsafe { libc::signal(signal, outlive as *const () as libc::sighandler_t) };
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("orchestrate {TASK_SUBCOMMAND}: cannot start `{exe}`: {e}");
            write_record(&records, rank, local_rank, &node, Some(127), None);
            return 127;
        }
    };
    let status = loop {
        match child.wait() {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("orchestrate {TASK_SUBCOMMAND}: cannot wait for `{exe}`: {e}");
                return 1;
            }
        }
    };
    use std::os::unix::process::ExitStatusExt;
    let signal = status.signal();
    if placed {
        // The instance's whole tree is gone before its record and its node's GPU check.
        super::step_tree::kill_and_reap(child.id() as i32);
        if let Some(end) = relay {
            end.finish();
        }
        if let Some(stage_dir) = records.as_deref().and_then(std::path::Path::parent) {
            // This process's switches, read once: the wrapper is a process of its own.
            let settings = crate::settings::Settings::from_env();
            let limit = settings.node_check_max_used_mib.as_deref();
            super::step_tree::check_gpus(stage_dir, &node, limit);
        }
    }
    write_record(&records, rank, local_rank, &node, status.code(), signal);
    if STOPPING.load(std::sync::atomic::Ordering::SeqCst) {
        // Not a failure srun should answer by killing the other tasks (see the module's doc).
        return 0;
    }
    match (status.code(), signal) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    }
}

fn write_record(
    dir: &Option<PathBuf>,
    rank: u32,
    local_rank: u32,
    node: &str,
    exit_code: Option<i32>,
    signal: Option<i32>,
) {
    let Some(dir) = dir else { return };
    let record = TaskRecord {
        rank,
        local_rank,
        node: node.to_string(),
        exit_code,
        signal: signal.map(crate::process::tree::signal_name),
    };
    let written = std::fs::create_dir_all(dir).and_then(|()| {
        let bytes = serde_json::to_vec_pretty(&record).map_err(std::io::Error::other)?;
        crate::store::rundir::write_atomic(&dir.join(format!("rank-{rank}.json")), &bytes)
    });
    if let Err(e) = written {
        eprintln!(
            "orchestrate {TASK_SUBCOMMAND}: cannot record rank {rank} in {}: {e}",
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::records::first_failure;

    #[test]
    fn first_host_of_slurm_host_lists() {
        assert_eq!(first_host("vm").as_deref(), Some("vm"));
        assert_eq!(first_host("a,b").as_deref(), Some("a"));
        assert_eq!(first_host("gpu[01-04,07],cpu1").as_deref(), Some("gpu01"));
        assert_eq!(first_host("n[3,5]-ib").as_deref(), Some("n3-ib"));
        assert_eq!(first_host(""), None);
    }

    #[test]
    fn the_first_failed_task_by_rank_gives_the_exit_status() {
        let dir = e2e_tests::Scratch::new("task-first-failure");
        let record = |rank: u32, exit_code: Option<i32>, signal: Option<i32>| {
            write_record(
                &Some(dir.to_path_buf()),
                rank,
                rank,
                "n1",
                exit_code,
                signal,
            )
        };
        assert_eq!(first_failure(&dir), None, "no records");
        record(0, Some(0), None);
        record(1, Some(0), None);
        assert_eq!(first_failure(&dir), None, "every task exited 0");
        record(2, None, Some(libc::SIGKILL));
        assert_eq!(first_failure(&dir), Some(128 + 9), "killed by SIGKILL");
        record(1, Some(7), None);
        assert_eq!(
            first_failure(&dir),
            Some(7),
            "the lowest failed rank's exit"
        );
    }
}
