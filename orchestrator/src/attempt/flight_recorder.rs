//! PyTorch's NCCL flight recorder, asked for before a hung stage is stopped.
//!
//! A command stage with GPUs gets, unless its plan or orchestrate's own environment sets them:
//! `TORCH_NCCL_TRACE_BUFFER_SIZE` (the recorder keeps the last collectives of each process
//! group), `TORCH_NCCL_DEBUG_INFO_TEMP_FILE` (where a rank dumps them: `trace-rank-<RANK>`)
//! and `TORCH_NCCL_DEBUG_INFO_PIPE_FILE` (each rank whose default process group uses NCCL
//! makes a FIFO `rank-<RANK>.pipe` there, and dumps when something is written to it), all in
//! `stages/<name>/nccl-<attempt>/`. When the stage hangs, [`request_dumps`] writes to every
//! such FIFO, waits for the dumps, and moves them into the hang's evidence folder.
//! Stages that do not use NCCL make no FIFO and are not affected.

use protocol::worker::ENV_FLIGHT_RECORDER_FILES;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Entries the recorder keeps when the stage does not choose.
const TRACE_BUFFER: &str = "2000";

/// How long the ranks get to write their dumps.
const DUMP_DEADLINE: Duration = Duration::from_secs(10);

/// The folder of attempt `attempt`'s FIFOs and dumps.
pub fn dir(stage_dir: &Path, attempt: u32) -> PathBuf {
    stage_dir.join(format!("nccl-{attempt}"))
}

/// The variables that turn the recorder on for attempt `attempt` (the folder is made), less
/// those the plan's `env` or orchestrate's environment already set.
pub fn stage_env(
    stage_dir: &Path,
    attempt: u32,
    plan_env: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let dir = dir(stage_dir, attempt);
    if std::fs::create_dir_all(&dir).is_err() {
        return Vec::new();
    }
    let prefix = |p: &str| dir.join(p).to_string_lossy().into_owned();
    [
        ("TORCH_NCCL_TRACE_BUFFER_SIZE", TRACE_BUFFER.to_string()),
        (ENV_FLIGHT_RECORDER_FILES[0], prefix("trace-rank-")),
        (ENV_FLIGHT_RECORDER_FILES[1], prefix("rank-")),
    ]
    .into_iter()
    .filter(|(k, _)| !plan_env.contains_key(*k) && std::env::var_os(k).is_none())
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Asks every rank of attempt `attempt` that made a FIFO for its flight recorder's dump, waits
/// up to [`DUMP_DEADLINE`] for them, and moves the dumps into `evidence`. Returns how many
/// ranks were asked and how many dumped.
pub async fn request_dumps(stage_dir: &Path, attempt: u32, evidence: &Path) -> (usize, usize) {
    let dir = dir(stage_dir, attempt);
    let fifos: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rank = name
                .strip_prefix("rank-")?
                .strip_suffix(".pipe")?
                .to_string();
            Some((rank, e.path()))
        })
        .collect();
    let asked = fifos.iter().filter(|(_, fifo)| poke(fifo)).count();
    if asked == 0 {
        return (0, 0);
    }
    // A dump is done once it has bytes and has not changed for 300 ms.
    let dumps = || -> usize {
        fifos
            .iter()
            .filter(|(rank, _)| {
                std::fs::metadata(dir.join(format!("trace-rank-{rank}"))).is_ok_and(|m| {
                    m.len() > 0
                        && m.modified().is_ok_and(|t| {
                            t.elapsed().unwrap_or_default() > Duration::from_millis(300)
                        })
                })
            })
            .count()
    };
    let deadline = tokio::time::Instant::now() + DUMP_DEADLINE;
    while dumps() < asked && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::fs::create_dir_all(evidence);
    let mut dumped = 0;
    for (rank, _) in &fifos {
        let from = dir.join(format!("trace-rank-{rank}"));
        let to = evidence.join(format!("nccl-trace-rank-{rank}"));
        if std::fs::rename(&from, &to).is_ok() || std::fs::copy(&from, &to).is_ok() {
            dumped += 1;
        }
    }
    (asked, dumped)
}

/// Writes to a rank's FIFO without blocking (no reader: nothing to ask).
fn poke(fifo: &Path) -> bool {
    use std::io::Write;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    if !std::fs::metadata(fifo).is_ok_and(|m| m.file_type().is_fifo()) {
        return false;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(fifo)
        .and_then(|mut f| f.write_all(b"1\n"))
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plans_own_settings_win() {
        let stage = std::env::temp_dir().join(format!("fr-env-{}", std::process::id()));
        let mut plan = BTreeMap::new();
        plan.insert("TORCH_NCCL_TRACE_BUFFER_SIZE".into(), "50".into());
        let env = stage_env(&stage, 2, &plan);
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
                "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
            ]
        );
        assert!(env[1].1.ends_with("nccl-2/rank-"));
        let _ = std::fs::remove_dir_all(&stage);
    }

    /// A stand-in for a rank's recorder, as PyTorch's does it: a FIFO it reads without
    /// blocking, and a dump written when something arrives.
    #[tokio::test]
    async fn a_rank_listening_on_its_fifo_is_asked_and_its_dump_moved_to_the_evidence() {
        let stage = std::env::temp_dir().join(format!("fr-dump-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&stage);
        let env = stage_env(&stage, 1, &BTreeMap::new());
        let var = |k: &str| env.iter().find(|(n, _)| n == k).unwrap().1.clone();
        let rank = format!(
            "f={pipe}0.pipe; mkfifo $f; exec 3<>$f; read -r line <&3; echo trace > {temp}0",
            pipe = var("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"),
            temp = var("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
        );
        let mut child = std::process::Command::new("sh")
            .args(["-c", &rank])
            .spawn()
            .unwrap();
        let fifo = dir(&stage, 1).join("rank-0.pipe");
        for _ in 0..100 {
            if fifo.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let evidence = stage.join("hung-1");
        assert_eq!(request_dumps(&stage, 1, &evidence).await, (1, 1));
        assert_eq!(
            std::fs::read_to_string(evidence.join("nccl-trace-rank-0")).unwrap(),
            "trace\n"
        );
        child.wait().unwrap();
        let _ = std::fs::remove_dir_all(&stage);
    }
}
