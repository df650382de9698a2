//! Whether every node of an allocation sees the run directory: placed steps
//! ([`super::placement`]) write their logs, outputs and task records there, and the batch node
//! reads them, so a run spread over nodes needs a directory they share. At the start of such a
//! run, the orchestrator writes a token into the run directory and one job step, one task per
//! node, reads it back on every node; a node that does not see the token refuses the run, with
//! the nodes named.

use super::{helper, Allocation, SlurmError};
use crate::process::reaper::Reaper;
use std::path::Path;
use std::time::Duration;

/// The file the token is written to, in the run directory.
const TOKEN_FILE: &str = ".nodes-see-this";

/// How long the one step may take.
const LIMIT: Duration = Duration::from_secs(60);

/// Checks that every node of `job` sees `run_dir`; `Err` names the nodes that do not, or says
/// why the check could not run. Must run on the thread of `reaper`.
pub(crate) async fn check(
    run_dir: &Path,
    job: &Allocation,
    reaper: &Reaper,
) -> Result<(), SlurmError> {
    let token = format!(
        "{}-{}",
        std::process::id(),
        crate::process::scan::own_pid() as u64 ^ nanos()
    );
    let path = run_dir.join(TOKEN_FILE);
    let not_shared = |nodes: Vec<String>, detail: String| SlurmError::RunDirNotShared {
        dir: run_dir.to_path_buf(),
        nodes,
        detail,
    };
    std::fs::write(&path, &token)
        .map_err(|e| not_shared(Vec::new(), format!("cannot write {}: {e}", path.display())))?;
    let argv = vec![
        "srun".to_string(),
        "--job-name=run-dir-check".into(),
        "--overlap".into(),
        format!("--nodes={}", job.num_nodes),
        format!("--ntasks={}", job.num_nodes),
        "--ntasks-per-node=1".into(),
        "sh".into(),
        "-c".into(),
        r#"printf '%s %s\n' "${SLURMD_NODENAME:-$(hostname -s)}" "$(cat "$0" 2>/dev/null || echo -)""#.into(),
        path.display().to_string(),
    ];
    let out = helper::run(reaper, &argv, LIMIT).await;
    let _ = std::fs::remove_file(&path);
    let out =
        out.map_err(|e| not_shared(Vec::new(), format!("`srun` could not be started: {e}")))?;
    if !out.success() {
        return Err(not_shared(
            Vec::new(),
            format!("the check's srun {}", out.failure()),
        ));
    }
    match unseen(&token, &out.stdout, job.num_nodes) {
        None => Ok(()),
        Some((nodes, detail)) => Err(not_shared(nodes, detail)),
    }
}

fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// From the check's output (`NODE TOKEN` per node), the nodes that did not read `token` and
/// what was wrong, or `None` when all `nodes` answered with it.
pub(crate) fn unseen(token: &str, output: &str, nodes: u32) -> Option<(Vec<String>, String)> {
    let mut answered = 0u32;
    let mut blind = Vec::new();
    for line in output.lines().filter(|l| !l.trim().is_empty()) {
        let (node, read) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
        answered += 1;
        if read.trim() != token {
            blind.push(node.to_string());
        }
    }
    blind.sort();
    if !blind.is_empty() {
        return Some((blind, "they cannot read what this node wrote there".into()));
    }
    (answered < nodes).then(|| {
        (
            Vec::new(),
            format!("only {answered} of the {nodes} nodes answered"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_that_does_not_read_the_token_is_named() {
        assert_eq!(unseen("t1", "n1 t1\nn2 t1\nn3 t1\n", 3), None);
        let (nodes, _) = unseen("t1", "n1 t1\nn3 -\nn2 t0\n", 3).unwrap();
        assert_eq!(nodes, ["n2", "n3"]);
        let (nodes, detail) = unseen("t1", "n1 t1\n", 3).unwrap();
        assert!(nodes.is_empty());
        assert_eq!(detail, "only 1 of the 3 nodes answered");
        assert!(unseen("t1", "n1\n", 1).is_some(), "no token read at all");
    }

    #[test]
    fn the_refusal_says_what_to_do() {
        let e = SlurmError::RunDirNotShared {
            dir: "/tmp/runs/x".into(),
            nodes: vec!["n2".into(), "n3".into()],
            detail: "they cannot read what this node wrote there".into(),
        };
        let text = e.to_string();
        assert!(text.contains("/tmp/runs/x"), "{text}");
        assert!(text.contains("n2, n3"), "{text}");
        assert!(text.contains("--run-dir"), "{text}");
    }
}
