//! The GPU check of every node of a stage that ran through `srun`: once the stage's step has
//! ended, `orchestrate gpu-check --json` runs as a step of one task per node, each node's
//! answer lands in its own file, and every node gets a verdict in the report. A node without
//! NVML says "unavailable"; a check that could not run at all says "failed" and why.

use super::{helper, hidden_args, Allocation};
use crate::process::reaper::{ExitStatus, Reaper};
use protocol::plan::{Stage, TaskLayout};
use protocol::report::NodeGpuCheck;
use protocol::status::NodeVerdict;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the per-node check may take in all.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(120);

/// The check due after one attempt of a stage that runs through srun inside a job.
#[derive(Debug, Clone)]
pub struct NodeCheck {
    layout: TaskLayout,
    stage_dir: PathBuf,
    max_used_mib: Option<String>,
}

impl NodeCheck {
    /// The check for `stage`, or `None` when it does not run through srun (or not in a job);
    /// `max_used_mib`: the check's `--max-used-mib`, if given
    /// (`ORCHESTRATE_NODE_CHECK_MAX_USED_MIB`, [`crate::settings::Settings`]).
    pub fn for_stage(
        stage: &Stage,
        job: Option<&Allocation>,
        stage_dir: &Path,
        max_used_mib: Option<&str>,
    ) -> Option<NodeCheck> {
        job?;
        Some(NodeCheck {
            layout: stage.task_layout()?,
            stage_dir: stage_dir.to_path_buf(),
            max_used_mib: max_used_mib.map(str::to_string),
        })
    }

    /// The `--max-used-mib` it runs with, if given.
    #[cfg(test)]
    pub fn max_used_mib(&self) -> Option<&str> {
        self.max_used_mib.as_deref()
    }

    /// Runs it after the attempt (the caller skips it after one stopped by a signal: the job
    /// is on its way out). Must run on the reaper's thread.
    pub async fn run(self, reaper: &Reaper) {
        let limit = self.max_used_mib.as_deref();
        after_stage(self.layout, &self.stage_dir, limit, reaper).await;
    }
}

/// Runs the check on the stage's nodes and saves every node's verdict beside the stage's
/// logs; returns them. Must run on the reaper's thread.
pub async fn after_stage(
    layout: TaskLayout,
    stage_dir: &Path,
    max_used_mib: Option<&str>,
    reaper: &Reaper,
) -> Vec<NodeGpuCheck> {
    let dir = stage_dir.join("node-gpu-check");
    let _ = std::fs::remove_dir_all(&dir);
    let checks = match std::fs::create_dir_all(&dir) {
        Ok(()) => run_check(layout, &dir, max_used_mib, reaper).await,
        Err(e) => vec![failed(format!("cannot create {}: {e}", dir.display()))],
    };
    if let Ok(bytes) = serde_json::to_vec_pretty(&checks) {
        let _ = crate::store::rundir::write_atomic(
            &super::records::node_checks_path(stage_dir),
            &bytes,
        );
    }
    checks
}

fn failed(detail: String) -> NodeGpuCheck {
    NodeGpuCheck {
        node: "-".into(),
        verdict: NodeVerdict::Failed,
        detail,
    }
}

async fn run_check(
    layout: TaskLayout,
    dir: &Path,
    max_used_mib: Option<&str>,
    reaper: &Reaper,
) -> Vec<NodeGpuCheck> {
    let mut argv = vec![
        "srun".to_string(),
        "--job-name=gpu-check".into(),
        // The check needs next to nothing; it may share the CPUs of steps still running.
        "--overlap".into(),
        format!("--nodes={}", layout.nodes),
        format!("--ntasks={}", layout.nodes),
        "--ntasks-per-node=1".into(),
        // Each answer in a file named for the node as Slurm names it (`SLURMD_NODENAME`): srun's
        // `%N` is the host name, the same for nodes that share a host.
        "sh".into(),
        "-c".into(),
        r#"exe=$0 dir=$1; shift; n=${SLURMD_NODENAME:-$(hostname -s)}; exec "$exe" gpu-check --json "$@" >"$dir/$n.json" 2>"$dir/$n.err""#.into(),
        hidden_args::orchestrate_exe(),
        dir.display().to_string(),
    ];
    if let Some(limit) = max_used_mib {
        argv.extend(["--max-used-mib".into(), limit.to_string()]);
    }
    let out = match helper::run(reaper, &argv, CHECK_TIMEOUT).await {
        Ok(out) => out,
        Err(e) => return vec![failed(format!("`srun` could not be started: {e}"))],
    };
    let mut nodes: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".json").map(str::to_string)
        })
        .collect();
    nodes.sort();
    if nodes.is_empty() {
        return vec![failed(format!(
            "the check did not run: srun {}",
            out.failure()
        ))];
    }
    nodes
        .into_iter()
        .map(|node| {
            let stdout =
                std::fs::read_to_string(dir.join(format!("{node}.json"))).unwrap_or_default();
            let stderr =
                std::fs::read_to_string(dir.join(format!("{node}.err"))).unwrap_or_default();
            verdict(node, &stdout, &stderr, out.status)
        })
        .collect()
}

/// One node's verdict from what its `gpu-check --json` printed.
pub fn verdict(node: String, stdout: &str, stderr: &str, srun: Option<ExitStatus>) -> NodeGpuCheck {
    let said = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().trim_start_matches("error: "))
        .collect::<Vec<_>>()
        .join("; ");
    let Ok(result) = serde_json::from_str::<serde_json::Value>(stdout) else {
        return NodeGpuCheck {
            node,
            verdict: if said.contains("NVML")
                || said.contains("nvml")
                || said.contains(crate::gpu::NO_DRIVER)
            {
                NodeVerdict::Unavailable
            } else {
                NodeVerdict::Failed
            },
            detail: if said.is_empty() {
                format!("no answer (srun: {srun:?})")
            } else {
                said
            },
        };
    };
    if result["available"] == serde_json::Value::Bool(false) {
        // `gpu-check --json` without NVML says so in JSON.
        return NodeGpuCheck {
            node,
            verdict: NodeVerdict::Unavailable,
            detail: result["error"]
                .as_str()
                .unwrap_or("NVML unavailable")
                .to_string(),
        };
    }
    let clean = result["clean"].as_bool().unwrap_or(false);
    let gpus: Vec<String> = result["gpus"]
        .as_array()
        .map(|gs| {
            gs.iter()
                .map(|g| {
                    format!(
                        "GPU {} used {} MiB{}",
                        g["index"],
                        g["used_bytes"].as_u64().unwrap_or(0) >> 20,
                        if g["clean"].as_bool().unwrap_or(false) {
                            ""
                        } else {
                            " (not clean)"
                        }
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    NodeGpuCheck {
        node,
        verdict: if clean {
            NodeVerdict::Clean
        } else {
            NodeVerdict::NotClean
        },
        detail: format!(
            "driver {}: {}",
            result["driver"].as_str().unwrap_or("?"),
            if gpus.is_empty() {
                "no GPU".to_string()
            } else {
                gpus.join(", ")
            }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_from_gpu_check_output() {
        let v = verdict(
            "n1".into(),
            "",
            "error: NVML is not available: libnvidia-ml.so.1 not found\n",
            Some(ExitStatus::Code(4)),
        );
        assert_eq!(v.verdict, NodeVerdict::Unavailable);
        let json = verdict(
            "n1".into(),
            r#"{"v":1,"available":false,"error":"NVML is not available (x)","clean":false,"gpus":[]}"#,
            "",
            Some(ExitStatus::Code(4)),
        );
        assert_eq!(json.verdict, NodeVerdict::Unavailable);
        assert_eq!(json.detail, "NVML is not available (x)");
        assert!(
            v.detail.starts_with("NVML is not available"),
            "{}",
            v.detail
        );
        let json = r#"{"v":1,"host":"n2","driver":"580.1","max_used_bytes":1,"gpus":[{"index":0,"uuid":"GPU-1","name":"H200","total_bytes":1,"used_bytes":2097152,"processes":[],"clean":false}],"clean":false,"waited_ms":0}"#;
        let v = verdict("n2".into(), json, "", Some(ExitStatus::Code(3)));
        assert_eq!(v.verdict, NodeVerdict::NotClean);
        assert_eq!(v.detail, "driver 580.1: GPU 0 used 2 MiB (not clean)");
        assert_eq!(
            verdict("n3".into(), "", "", None).verdict,
            NodeVerdict::Failed
        );
    }
}
