//! What a stage run through srun leaves in its stage directory: the records directory, where
//! the per-task wrappers (`task`) name their job step for the launcher
//! (`launch`) and record how each task ended (`rank-<RANK>.json`), and the verdicts of
//! the node GPU check after it (`node_check`). Written by those, read here.

use protocol::plan::Stage;
use protocol::report::{NodeGpuCheck, TaskRecord};
use std::path::{Path, PathBuf};

/// The file in the records directory where the tasks name their job step (`JOB.STEP`).
pub const STEP_FILE: &str = "step";

/// The directory where the tasks of a stage's last attempt leave their records.
pub fn records_dir(stage_dir: &Path) -> PathBuf {
    stage_dir.join("tasks")
}

/// The task records of a stage's last attempt (`DIR/rank-*.json`), by rank.
pub fn load_records(dir: &Path) -> Vec<TaskRecord> {
    let mut records: Vec<TaskRecord> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("rank-"))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .collect();
    records.sort_by_key(|r| r.rank);
    records
}

/// The exit status of the first task (by rank) of `dir`'s records that did not exit 0: its
/// exit code, or 128 + the signal that ended it; `None` when every recorded task exited 0.
pub fn first_failure(dir: &Path) -> Option<i32> {
    load_records(dir)
        .iter()
        .find_map(|r| match (r.exit_code, &r.signal) {
            (_, Some(signal)) => Some(
                signal
                    .parse::<nix::sys::signal::Signal>()
                    .map_or(1, |s| 128 + s as i32),
            ),
            (Some(0), None) => None,
            (Some(code), None) => Some(code),
            (None, None) => Some(1),
        })
}

/// Where the verdicts of a stage's last node check are kept.
pub(crate) fn node_checks_path(stage_dir: &Path) -> PathBuf {
    stage_dir.join("node-gpu-check.json")
}

/// The verdicts of a stage's last node check (empty when none ran).
pub fn load_node_checks(stage_dir: &Path) -> Vec<NodeGpuCheck> {
    std::fs::read(node_checks_path(stage_dir))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// The task records and node checks of a stage's last attempt, for its report: those of a
/// stage run through srun, or placed as a job step over an allocation's nodes
/// (`super::placement`); empty for any other stage (no records directory).
pub fn stage_records(stage: &Stage, stage_dir: &Path) -> (Vec<TaskRecord>, Vec<NodeGpuCheck>) {
    if stage.task_layout().is_none() && !records_dir(stage_dir).is_dir() {
        return (Vec::new(), Vec::new());
    }
    (
        load_records(&records_dir(stage_dir)),
        load_node_checks(stage_dir),
    )
}
