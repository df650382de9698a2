//! A GPU fault whose recovery needs a reset drains the node it happened on, with the reason:
//! a job on a fake GPU whose stage gets XID 79 leaves its node drained in the test cluster.

use super::{context, field, job_log, node_lock, sbatch, slurm_up, wait_for_end};
use e2e_tests::Scratch;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Puts a drained node back in service however the test ends.
struct Resume(String);

impl Drop for Resume {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let _ = Command::new("scontrol")
                .args(["update", &format!("nodename={}", self.0), "state=resume"])
                .stdin(Stdio::null())
                .status();
        }
    }
}

#[test]
fn an_xid_that_needs_a_reset_drains_the_node_with_the_reason() {
    if !slurm_up("an_xid_that_needs_a_reset_drains_the_node_with_the_reason") {
        return;
    }
    // Alone on the cluster: a drained node takes no other test's job.
    let _node = node_lock(true);
    let s = Scratch::new("slurm-xid-drain");
    let gpus = s.path().join("gpus");
    std::fs::create_dir_all(&gpus).unwrap();
    let plan = s.write(
        "plan.toml",
        &format!(
            "[[stage]]\nname = \"fault\"\ngpus = 1\ncommand = [\"sh\", \"-c\", \"echo 79 >> {}/GPU-fake-0.xid; exit 1\"]\n",
            gpus.display()
        ),
    );
    let job = s.write(
        "job.sh",
        &format!(
            "#!/bin/bash\n#SBATCH --output=slurm-orchestrate-%j.out\n#SBATCH -N1\n\
             export ORCHESTRATE_FAKE_GPUS=1 ORCHESTRATE_FAKE_GPU_DIR={gpus}\n\
             exec \"$ORCHESTRATE\" --plan {plan} --run-dir {run}\n",
            gpus = gpus.display(),
            plan = plan.display(),
            run = s.path().join("run").display()
        ),
    );
    std::fs::set_permissions(&job, std::fs::Permissions::from_mode(0o755)).unwrap();
    let id = sbatch(s.path(), &[], job.to_str().unwrap(), &[]);
    let end = wait_for_end(&id, Duration::from_secs(120), &job_log(s.path(), &id));
    let node = field(&end, "NodeList");
    let _resume = Resume(node.clone());
    let why = context(s.path(), &id);
    assert_eq!(field(&end, "JobState"), "FAILED", "{why}");
    assert!(why.contains("drained Slurm node"), "{why}");
    let shown = Command::new("scontrol")
        .args(["show", "node", "-o", &node])
        .stdin(Stdio::null())
        .output()
        .expect("scontrol runs");
    let shown = String::from_utf8_lossy(&shown.stdout).to_string();
    assert!(
        shown.contains("DRAIN") && shown.contains("Reason=orchestrate: XID 79 on GPU-fake-0"),
        "{shown}\n{why}"
    );
}
