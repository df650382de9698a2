//! Attempts of a placed stage instance ([`super::placement`]) lost on their node, and the
//! nodes its retries avoid.
//!
//! An attempt is *lost* when its job step ended before the per-task wrapper on a node could
//! record how the command ended: Slurm killed the step (`scancel`, a node failure) or the
//! node's `slurmd` died. This holds for a placed instance's one-task step and for a stage's
//! own multi-node step alike. Each task's wrapper names its node in the records directory as
//! soon as it starts ([`note_node`]); when srun then ends with a failure and a task that started
//! has no end record, the launcher
//! on the batch node records the loss in the stage directory ([`record`]), where it survives
//! the next attempt (which clears the records directory). The report lists every loss
//! (`StageReport::lost`), the console names the node, and every retry in the same allocation
//! asks srun to keep off the nodes the instance was lost on ([`exclude_arg`]).

use protocol::report::LostAttempt;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file in the records directory where the wrapper of task `rank` names its node at
/// start.
fn node_file(rank: u32) -> String {
    format!("node-{rank}")
}

/// Set by the orchestrator on a placed step's launcher: the attempt it runs.
pub const ENV_ATTEMPT: &str = "ORCHESTRATE_STEP_ATTEMPT";

/// One loss as kept in the stage directory: with the allocation it happened in, since a
/// requeued job may run on other nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    #[serde(flatten)]
    lost: LostAttempt,
    /// [`job_key`] of the allocation.
    job: String,
}

/// Names one start of a job (its id and restart count): losses in another start (after a
/// requeue) do not exclude nodes.
pub fn job_key(job_id: &str, restart_count: u32) -> String {
    format!("{job_id}+{restart_count}")
}

fn lost_path(stage_dir: &Path) -> PathBuf {
    stage_dir.join("lost-attempts.json")
}

fn entries(stage_dir: &Path) -> Vec<Entry> {
    std::fs::read(lost_path(stage_dir))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Names `node` as task `rank`'s in the records directory `records` (by the wrapper, before
/// the command starts).
pub fn note_node(records: &Path, rank: u32, node: &str) {
    let _ = std::fs::create_dir_all(records)
        .and_then(|()| std::fs::write(records.join(node_file(rank)), format!("{node}\n")));
}

/// The node of the lowest task that started (named its node in `records`) and never recorded
/// its end: the step was lost there. `None` when every task that started recorded its end.
pub fn lost_node(records: &Path) -> Option<String> {
    let ended: Vec<u32> = super::records::load_records(records)
        .iter()
        .map(|r| r.rank)
        .collect();
    let mut started: Vec<(u32, String)> = std::fs::read_dir(records)
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let rank = e
                .file_name()
                .to_str()?
                .strip_prefix("node-")?
                .parse()
                .ok()?;
            let node = std::fs::read_to_string(e.path()).ok()?.trim().to_string();
            (!node.is_empty()).then_some((rank, node))
        })
        .collect();
    started.sort();
    started
        .into_iter()
        .find(|(rank, _)| !ended.contains(rank))
        .map(|(_, node)| node)
}

/// Adds `lost` (in the allocation `job`, a [`job_key`]) to the losses of the stage whose
/// directory is `stage_dir`.
pub fn record(stage_dir: &Path, job: &str, lost: LostAttempt) -> std::io::Result<()> {
    let mut all = entries(stage_dir);
    all.push(Entry {
        lost,
        job: job.to_string(),
    });
    let bytes = serde_json::to_vec_pretty(&all).map_err(std::io::Error::other)?;
    crate::store::rundir::write_atomic(&lost_path(stage_dir), &bytes)
}

/// Every attempt of the stage in `stage_dir` lost on a node, in order.
pub fn load(stage_dir: &Path) -> Vec<LostAttempt> {
    entries(stage_dir).into_iter().map(|e| e.lost).collect()
}

/// The node attempt `attempt` of the stage in `stage_dir` was lost on, if it was.
pub fn node_of_attempt(stage_dir: &Path, attempt: u32) -> Option<String> {
    entries(stage_dir)
        .into_iter()
        .rev()
        .find(|e| e.lost.attempt == attempt)
        .map(|e| e.lost.node)
}

/// The distinct nodes the stage in `stage_dir` was lost on in the allocation `job`, oldest
/// first.
pub fn nodes_lost_in(stage_dir: &Path, job: &str) -> Vec<String> {
    let mut nodes: Vec<String> = Vec::new();
    for e in entries(stage_dir).into_iter().filter(|e| e.job == job) {
        nodes.retain(|n| *n != e.lost.node);
        nodes.push(e.lost.node);
    }
    nodes
}

/// srun's `--exclude=` for a retry that avoids the nodes in `lost` (oldest first), in an
/// allocation of `job_nodes` nodes, for a step that needs `needs` nodes: every lost node while
/// that leaves room for the step, else only the most recently lost ones that do — never every
/// node of the allocation. `None` when nothing is to be excluded.
pub fn exclude_arg(lost: &[String], job_nodes: u32, needs: u32) -> Option<String> {
    let room = job_nodes.saturating_sub(needs.max(1)) as usize;
    let keep = lost.len().min(room);
    let excluded = &lost[lost.len() - keep..];
    (!excluded.is_empty()).then(|| format!("--exclude={}", excluded.join(",")))
}

/// The node (and job step, when it says) one line of srun's stderr names as the one a step
/// was lost on: `Task launch for StepId=J.S failed on node N: …` (the node's slurmd does not
/// answer) or `Node failure on N`.
pub fn srun_says_lost(line: &str) -> Option<(String, Option<String>)> {
    let word = |rest: &str| {
        let w: String = rest
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != ':' && *c != ',')
            .collect();
        (!w.is_empty()).then_some(w)
    };
    if let Some((before, after)) = line.split_once(" failed on node ") {
        let step = before.split_once("StepId=").and_then(|(_, s)| word(s));
        return word(after).map(|node| (node, step));
    }
    let (_, after) = line.split_once("Node failure on ")?;
    word(after).map(|node| (node, None))
}

/// Copies srun's stderr `from` to `to` line by line, and returns what the first line that
/// names a lost node said ([`srun_says_lost`]).
pub fn watch_stderr(
    from: impl std::io::Read,
    mut to: impl std::io::Write,
) -> Option<(String, Option<String>)> {
    use std::io::BufRead;
    let mut said = None;
    let mut reader = std::io::BufReader::new(from);
    let mut line = Vec::new();
    while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
        let _ = to.write_all(&line).and_then(|()| to.flush());
        if said.is_none() {
            said = srun_says_lost(&String::from_utf8_lossy(&line));
        }
        line.clear();
    }
    said
}

/// After a placed step's srun ended with `code`: when the step was lost on its node (its
/// task's end never recorded, or srun said so on stderr: `srun_said`), records the loss (the
/// allocation and attempt from the launcher's environment) and returns the line that says
/// so, for the stage's stderr.
pub fn after_step(
    records: &Path,
    code: i32,
    srun_said: Option<(String, Option<String>)>,
) -> Option<String> {
    if code == 0 {
        return None;
    }
    let step_named = std::fs::read_to_string(records.join(super::records::STEP_FILE))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty());
    // srun's own word first: in a step of several nodes, the tasks on the nodes that stayed
    // up may also have been ended before they could record it.
    let (node, step) = match (srun_said, lost_node(records)) {
        (Some((node, step)), _) => (node, step.or(step_named)),
        (None, Some(node)) => (node, step_named),
        (None, None) => return None,
    };
    let step = step.unwrap_or_default();
    let stage_dir = records.parent()?;
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let attempt = var(ENV_ATTEMPT).and_then(|a| a.parse().ok()).unwrap_or(0);
    let restart = var("SLURM_RESTART_COUNT")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let job = job_key(&var("SLURM_JOB_ID").unwrap_or_default(), restart);
    let line = format!(
        "orchestrate: attempt {attempt} was lost on node {node}: job step {step} ended before its task could record its end (srun exit {code})"
    );
    let lost = LostAttempt {
        attempt,
        node,
        step,
    };
    if let Err(e) = record(stage_dir, &job, lost) {
        return Some(format!("{line}; cannot record it: {e}"));
    }
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(attempt: u32, node: &str) -> LostAttempt {
        LostAttempt {
            attempt,
            node: node.into(),
            step: format!("7.{attempt}"),
        }
    }

    #[test]
    fn a_step_without_its_tasks_end_record_was_lost_on_its_node() {
        let dir = e2e_tests::Scratch::new("lost-node");
        let records = dir.join("tasks");
        assert_eq!(lost_node(&records), None, "never started on a node");
        note_node(&records, 0, "n3");
        assert_eq!(lost_node(&records).as_deref(), Some("n3"));
        let end = protocol::report::TaskRecord {
            rank: 0,
            local_rank: 0,
            node: "n3".into(),
            exit_code: Some(1),
            signal: None,
        };
        std::fs::write(
            records.join("rank-0.json"),
            serde_json::to_vec(&end).unwrap(),
        )
        .unwrap();
        assert_eq!(lost_node(&records), None, "it recorded its end: not lost");
    }

    #[test]
    fn a_multi_node_step_was_lost_on_the_node_of_a_task_without_its_end_record() {
        let dir = e2e_tests::Scratch::new("lost-node-ranks");
        let records = dir.join("tasks");
        let end = |rank: u32, node: &str| {
            let record = protocol::report::TaskRecord {
                rank,
                local_rank: 0,
                node: node.into(),
                exit_code: Some(0),
                signal: None,
            };
            std::fs::write(
                records.join(format!("rank-{rank}.json")),
                serde_json::to_vec(&record).unwrap(),
            )
            .unwrap();
        };
        for (rank, node) in [(0, "n1"), (1, "n2"), (2, "n3")] {
            note_node(&records, rank, node);
        }
        // Ranks 0 and 2 recorded their ends (srun stopped them when n2 failed); rank 1 did not.
        end(0, "n1");
        end(2, "n3");
        assert_eq!(lost_node(&records).as_deref(), Some("n2"));
        end(1, "n2");
        assert_eq!(lost_node(&records), None, "every task recorded its end");
    }

    #[test]
    fn losses_are_kept_per_allocation_and_named_per_attempt() {
        let dir = e2e_tests::Scratch::new("lost-record");
        record(&dir, "7+0", lost(1, "n3")).unwrap();
        record(&dir, "7+0", lost(2, "n1")).unwrap();
        record(&dir, "7+0", lost(3, "n3")).unwrap();
        record(&dir, "7+1", lost(4, "n2")).unwrap();
        assert_eq!(
            load(&dir),
            [lost(1, "n3"), lost(2, "n1"), lost(3, "n3"), lost(4, "n2")]
        );
        assert_eq!(node_of_attempt(&dir, 2).as_deref(), Some("n1"));
        assert_eq!(node_of_attempt(&dir, 5), None);
        assert_eq!(
            nodes_lost_in(&dir, "7+0"),
            ["n1", "n3"],
            "distinct, most recent last"
        );
        assert_eq!(nodes_lost_in(&dir, "7+1"), ["n2"]);
        assert!(nodes_lost_in(&dir, "8+0").is_empty());
    }

    #[test]
    fn srun_names_the_node_a_step_was_lost_on() {
        assert_eq!(
            srun_says_lost("srun: error: Task launch for StepId=118.12 failed on node n3: Communication connection failure\n"),
            Some(("n3".into(), Some("118.12".into())))
        );
        assert_eq!(
            srun_says_lost("srun: error: Node failure on gpu07\n"),
            Some(("gpu07".into(), None))
        );
        assert_eq!(srun_says_lost("srun: Job step aborted\n"), None);
        assert_eq!(srun_says_lost("user output about a node\n"), None);
        let mut copy = Vec::new();
        let said = watch_stderr(
            &b"first\nsrun: error: Node failure on n2\nsrun: error: Task launch for StepId=1.2 failed on node n1: x\nlast"[..],
            &mut copy,
        );
        assert_eq!(said, Some(("n2".into(), None)), "the first node named");
        assert_eq!(
            String::from_utf8(copy).unwrap(),
            "first\nsrun: error: Node failure on n2\nsrun: error: Task launch for StepId=1.2 failed on node n1: x\nlast",
            "every byte passed on"
        );
    }

    #[test]
    fn a_retry_excludes_the_lost_nodes_but_never_every_node() {
        let nodes = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(exclude_arg(&[], 3, 1), None);
        assert_eq!(
            exclude_arg(&nodes(&["n3"]), 3, 1).as_deref(),
            Some("--exclude=n3")
        );
        assert_eq!(
            exclude_arg(&nodes(&["n3", "n1"]), 3, 1).as_deref(),
            Some("--exclude=n3,n1")
        );
        assert_eq!(
            exclude_arg(&nodes(&["n3", "n1", "n2"]), 3, 1).as_deref(),
            Some("--exclude=n1,n2"),
            "all three lost: the two most recent, one node left"
        );
        assert_eq!(exclude_arg(&nodes(&["n1"]), 1, 1), None, "one node");
        assert_eq!(
            exclude_arg(&nodes(&["n3", "n1"]), 3, 2).as_deref(),
            Some("--exclude=n1"),
            "a two-node step keeps two nodes"
        );
    }
}
