//! What a hung stage was doing, saved before it is stopped, under
//! `stages/<name>/hung-<attempt>/`:
//! - `processes.txt`: every process of the stage — pid, name, state, the kernel function it
//!   sleeps in (`wchan`), CPU seconds;
//! - `stack-<pid>.txt`: each Python process's stacks from `py-spy dump` (any CPython, no
//!   cooperation from the stage), where py-spy is installed (`$ORCHESTRATE_PY_SPY`, on `PATH`,
//!   or beside the stage's Python);
//! - `gpus.txt`: the stage's GPUs' memory and the processes holding it.
//! - `nccl-trace-rank-<RANK>`: each NCCL rank's flight recorder, where the stage uses NCCL
//!   (`crate::attempt::flight_recorder`, asked for before this is collected).
//!
//! The top frame of each process's main thread is also returned, for the console and the report.

use crate::gpu::MemoryProbe;
use crate::process::tree::StoppedProcess;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long one `py-spy dump` may take.
const DUMP_DEADLINE: Duration = Duration::from_secs(10);

/// What was saved.
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    /// The folder it is in.
    pub dir: PathBuf,
    /// Each process's top frame, "pid 123 (python3): all_reduce (distributed_c10d.py:2810)".
    pub frames: Vec<String>,
    /// Why there are no stacks, when there are none.
    pub no_stacks: Option<String>,
}

/// Saves the evidence of attempt `attempt` of the stage in `stage_dir`, whose processes are
/// `members`, whose first argument is `argv0` and whose GPUs are as [`gpu_state`] described
/// them. `py-spy` runs as a child reaped by `reaper` (this must run on its thread).
pub async fn collect(
    reaper: &crate::process::reaper::Reaper,
    stage_dir: &Path,
    attempt: u32,
    members: &[StoppedProcess],
    argv0: Option<&str>,
    gpus: Option<String>,
) -> Evidence {
    let dir = stage_dir.join(format!("hung-{attempt}"));
    let _ = std::fs::create_dir_all(&dir);
    let listing: String = members.iter().map(describe).collect();
    let _ = std::fs::write(dir.join("processes.txt"), listing);
    if let Some(gpus) = gpus {
        let _ = std::fs::write(dir.join("gpus.txt"), gpus);
    }
    let mut evidence = Evidence {
        dir: dir.clone(),
        ..Default::default()
    };
    let Some(py_spy) = py_spy(argv0) else {
        evidence.no_stacks =
            Some("py-spy is not installed (pip install py-spy, or set ORCHESTRATE_PY_SPY)".into());
        return evidence;
    };
    for p in members {
        if let Some(stack) = dump(reaper, &py_spy, p.pid).await {
            let _ = std::fs::write(dir.join(format!("stack-{}.txt", p.pid)), &stack);
            if let Some(top) = main_thread_top(&stack) {
                evidence
                    .frames
                    .push(format!("pid {} ({}): {top}", p.pid, p.name));
            }
        }
    }
    if evidence.frames.is_empty() {
        evidence.no_stacks = Some("py-spy found no Python stack in the stage's processes".into());
    }
    evidence
}

/// One line for `processes.txt`.
fn describe(p: &StoppedProcess) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.pid))
        .ok()
        .and_then(|text| crate::process::scan::parse_stat(&text));
    let wchan = std::fs::read_to_string(format!("/proc/{}/wchan", p.pid)).unwrap_or_default();
    format!(
        "pid {} ({}): state {}, waiting in {}, {} CPU s\n",
        p.pid,
        p.name,
        stat.as_ref().map_or('?', |s| s.state),
        if wchan.is_empty() || wchan == "0" {
            "-"
        } else {
            &wchan
        },
        stat.map_or("?".into(), |s| format!("{:.2}", s.cpu_seconds()))
    )
}

/// The CPU seconds of `pids` (user and system, with their waited-for children's), summed.
pub fn cpu_seconds(pids: impl IntoIterator<Item = i32>) -> f64 {
    pids.into_iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|text| crate::process::scan::parse_stat(&text))
        .map(|s| s.cpu_seconds())
        .sum()
}

/// The memory of the GPUs `gpus` and who holds it, for `gpus.txt`.
pub fn gpu_state(gpus: &[String], probe: &dyn MemoryProbe) -> String {
    let mut out = String::new();
    for uuid in gpus {
        let used = probe
            .used_bytes(uuid)
            .map_or("?".into(), |b| format!("{} MiB", b >> 20));
        out.push_str(&format!("{uuid}: {used} used\n"));
        for holder in probe.holders(uuid) {
            out.push_str(&format!("  {holder:?}\n"));
        }
    }
    out
}

/// The py-spy to use: `$ORCHESTRATE_PY_SPY`, `py-spy` on `PATH`, or beside the stage's first
/// argument when that is a path (a virtual environment's python).
fn py_spy(argv0: Option<&str>) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ORCHESTRATE_PY_SPY") {
        return Some(PathBuf::from(path));
    }
    let beside = argv0
        .filter(|a| a.contains('/'))
        .and_then(|a| Path::new(a).parent().map(|d| d.join("py-spy")));
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("py-spy"))
            .find(|p| p.is_file())
    });
    on_path.or(beside.filter(|p| p.is_file()))
}

/// `py-spy dump --pid PID`, if it says something within its deadline.
async fn dump(reaper: &crate::process::reaper::Reaper, py_spy: &Path, pid: i32) -> Option<String> {
    let argv = [
        py_spy.display().to_string(),
        "dump".into(),
        "--pid".into(),
        pid.to_string(),
    ];
    let out = crate::slurm::helper::run(reaper, &argv, DUMP_DEADLINE)
        .await
        .ok()?;
    let ok = out.status == Some(crate::process::reaper::ExitStatus::Code(0));
    (ok && !out.stdout.trim().is_empty()).then_some(out.stdout)
}

/// The first frame of the main thread (else the first thread) in a `py-spy dump`.
fn main_thread_top(stack: &str) -> Option<String> {
    let lines: Vec<&str> = stack.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("Thread ") && l.contains("MainThread"))
        .or_else(|| lines.iter().position(|l| l.starts_with("Thread ")))?;
    lines[header + 1..]
        .iter()
        .find(|l| l.starts_with(' ') && !l.trim().is_empty())
        .map(|l| l.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_threads_top_frame_is_picked() {
        let stack = "Process 7: python rank.py\nPython v3.12.3\n\nThread 9 (idle): \"Thread-1\"\n    wait (threading.py:320)\n\nThread 7 (idle): \"MainThread\"\n    all_reduce (torch/distributed/distributed_c10d.py:2810)\n        Arguments:\n    main (rank.py:20)\n";
        assert_eq!(
            main_thread_top(stack).as_deref(),
            Some("all_reduce (torch/distributed/distributed_c10d.py:2810)")
        );
    }

    #[test]
    fn cpu_seconds_of_this_process_are_read() {
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        assert!(cpu_seconds([std::process::id() as i32]) > 0.0);
    }
}
