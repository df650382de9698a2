//! GPU health on fake GPUs: an XID reported for a stage's GPU is in its verdict with NVIDIA's
//! meaning and recovery action; one whose recovery needs a reset quarantines the GPU (a retry
//! goes elsewhere); the health gate refuses a GPU whose error counters say it needs a reset.

use e2e_tests::{orchestrate, run_plan_with, RunResult, Scratch};
use std::path::Path;
use std::process::Command;

/// `orchestrate --plan PLAN` on `gpus` fake GPUs whose files are in `dir`.
fn run_on_fake_gpus(s: &Scratch, plan: &Path, gpus: u32, dir: &Path) -> RunResult {
    std::fs::create_dir_all(dir).unwrap();
    let mut cmd = Command::new(orchestrate());
    cmd.env("ORCHESTRATE_FAKE_GPUS", gpus.to_string())
        .env("ORCHESTRATE_FAKE_GPU_DIR", dir);
    run_plan_with(cmd, s, plan, &[])
}

/// A stage on one GPU that writes the UUID it got to `gpu.txt`, after `script`.
fn stage(name: &str, extra: &str, script: &str) -> String {
    format!(
        "[[stage]]\nname = \"{name}\"\ngpus = 1\noutputs = [\"gpu.txt\"]\n{extra}\ncommand = [\"sh\", \"-c\", \"{script} echo $ORCHESTRATE_GPU_UUIDS > {{output}}/gpu.txt\"]\n"
    )
}

fn gpu_of(run: &RunResult, stage: &str) -> String {
    std::fs::read_to_string(run.run_dir.join(format!("stages/{stage}/output/gpu.txt")))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn an_xid_31_is_in_the_stages_verdict_and_the_gpu_is_used_next() {
    let s = Scratch::new("xid-31");
    let dir = s.path().join("gpus");
    let inject = format!("echo 31 >> {}/$ORCHESTRATE_GPU_UUIDS.xid;", dir.display());
    let plan = s.write(
        "plan.toml",
        &format!(
            "{}{}",
            stage("fault", "", &inject),
            stage("next", "after = [\"fault\"]", "")
        ),
    );
    let run = run_on_fake_gpus(&s, &plan, 1, &dir);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let fault = run.stage("fault");
    let xids = &fault["gpu"][0]["xids"];
    assert_eq!(xids.as_array().map(Vec::len), Some(1), "{fault}");
    assert_eq!(xids[0]["xid"], 31);
    assert!(
        xids[0]["meaning"].as_str().unwrap().contains("page fault"),
        "{xids}"
    );
    assert_eq!(xids[0]["needs_reset"], false);
    assert!(
        run.stderr
            .contains("fault: GPU GPU-fake-0: XID 31 (GPU memory page fault"),
        "{}",
        run.stderr
    );
    // 31 needs no reset: the next stage runs on the same GPU, without the XID in its verdict.
    assert_eq!(gpu_of(&run, "next"), "GPU-fake-0");
    assert!(run.stage("next")["gpu"][0].get("xids").is_none());
}

#[test]
fn an_xid_79_quarantines_the_gpu_and_the_retry_and_the_next_stage_go_elsewhere() {
    let s = Scratch::new("xid-79");
    let dir = s.path().join("gpus");
    // On GPU-fake-0 the stage's GPU falls off the bus and it fails; elsewhere it succeeds.
    let inject = format!(
        "if [ $ORCHESTRATE_GPU_UUIDS = GPU-fake-0 ]; then echo 79 >> {}/GPU-fake-0.xid; exit 1; fi;",
        dir.display()
    );
    let plan = s.write(
        "plan.toml",
        &format!(
            "{}{}",
            stage("fault", "retries = 1", &inject),
            stage("next", "after = [\"fault\"]", "")
        ),
    );
    let run = run_on_fake_gpus(&s, &plan, 2, &dir);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "fault: GPU GPU-fake-0: XID 79 (GPU has fallen off the bus); recovery: reboot the node"
        ) && run.stderr.contains("the GPU is quarantined"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("GPU GPU-fake-0 quarantined"),
        "{}",
        run.stderr
    );
    let fault = run.stage("fault");
    assert_eq!(fault["attempts"], 2, "{fault}");
    assert_eq!(gpu_of(&run, "fault"), "GPU-fake-1");
    assert_eq!(gpu_of(&run, "next"), "GPU-fake-1");

    // With no other GPU, the next stage cannot run, and says why.
    let s = Scratch::new("xid-79-alone");
    let dir = s.path().join("gpus");
    let inject = format!("echo 79 >> {}/GPU-fake-0.xid;", dir.display());
    let plan = s.write(
        "plan.toml",
        &format!(
            "{}{}",
            stage("fault", "", &inject),
            stage("next", "after = [\"fault\"]", "")
        ),
    );
    let run = run_on_fake_gpus(&s, &plan, 1, &dir);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let next = run.stage("next");
    assert_eq!(next["failure"], "no_gpu", "{next}");
    assert!(
        next["error"]
            .as_str()
            .unwrap()
            .contains("1 quarantined after leaks or GPU faults"),
        "{next}"
    );
}

#[test]
fn the_health_gate_refuses_a_gpu_with_pending_remaps_and_says_why() {
    let s = Scratch::new("health-gate");
    let dir = s.path().join("gpus");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("GPU-fake-0.health"),
        "uncorrectable_ecc 0\npending_remaps 1\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("GPU-fake-1.health"),
        "uncorrectable_ecc 0\npending_remaps 0\n",
    )
    .unwrap();
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\nmax_parallel = 2\n{}{}",
            stage("a", "", "sleep 1;"),
            stage("b", "", "sleep 1;")
        ),
    );
    let run = run_on_fake_gpus(&s, &plan, 2, &dir);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(gpu_of(&run, "a"), "GPU-fake-1");
    assert_eq!(gpu_of(&run, "b"), "GPU-fake-1");
    assert!(
        run.stderr
            .contains("GPU 0 refused by the health gate: 1 row remap(s) pending a GPU reset"),
        "{}",
        run.stderr
    );
}

#[test]
fn retry_on_retries_only_the_causes_it_names() {
    let s = Scratch::new("retry-on");
    let dir = s.path().join("gpus");
    let once = |name: &str, fail: &str| {
        let mark = s.path().join(format!("{name}.tried"));
        format!(
            "if [ ! -e {m} ]; then touch {m}; {fail}; fi;",
            m = mark.display()
        )
    };
    let xid = once(
        "xid",
        &format!(
            "echo 31 >> {}/$ORCHESTRATE_GPU_UUIDS.xid; exit 1",
            dir.display()
        ),
    );
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\nretry_on = [\"xid\", \"exit:3\"]\n{}{}{}",
            stage("gpu_fault", "retries = 2", &xid),
            stage("exit3", "retries = 2", &once("exit3", "exit 3")),
            stage("exit4", "retries = 2", &once("exit4", "exit 4")),
        ),
    );
    let run = run_on_fake_gpus(&s, &plan, 1, &dir);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(
        run.stage("gpu_fault")["status"],
        "succeeded",
        "{}",
        run.stderr
    );
    assert_eq!(run.stage("gpu_fault")["attempts"], 2);
    assert_eq!(run.stage("exit3")["status"], "succeeded");
    assert_eq!(run.stage("exit3")["attempts"], 2);
    // Exit 4 is not named: not retried, whatever `retries` says.
    assert_eq!(run.stage("exit4")["status"], "failed");
    assert_eq!(run.stage("exit4")["attempts"], 1);

    let bad = s.write(
        "bad.toml",
        "[run]\nretry_on = [\"sometimes\"]\n[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n",
    );
    let out = Command::new(orchestrate())
        .args(["validate"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("`sometimes` is not a cause to retry on"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_retry_after_an_xid_that_needs_no_reset_avoids_the_gpu_it_ran_on() {
    let s = Scratch::new("xid-retry-elsewhere");
    let dir = s.path().join("gpus");
    let mark = s.path().join("tried");
    // The first attempt gets XID 13 on its GPU and fails; the retry succeeds wherever it runs.
    let inject = format!(
        "if [ ! -e {m} ]; then touch {m}; echo 13 >> {d}/$ORCHESTRATE_GPU_UUIDS.xid; exit 1; fi;",
        m = mark.display(),
        d = dir.display()
    );
    let plan = s.write("plan.toml", &stage("fault", "retries = 1", &inject));
    let run = run_on_fake_gpus(&s, &plan, 2, &dir);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        std::fs::read_to_string(dir.join("GPU-fake-0.xid")).is_ok(),
        "the first attempt ran on GPU-fake-0"
    );
    assert_eq!(run.stage("fault")["attempts"], 2);
    // 13 quarantines nothing, yet the retry went to the other GPU.
    assert_eq!(gpu_of(&run, "fault"), "GPU-fake-1");
    assert!(!run.stderr.contains("quarantined"), "{}", run.stderr);
}

#[test]
fn counters_that_turn_bad_during_a_stage_are_in_its_verdict_and_the_next_stage_goes_elsewhere() {
    let s = Scratch::new("health-after");
    let dir = s.path().join("gpus");
    // The stage's run leaves two row remaps pending on its GPU.
    let remap = format!(
        "echo 'pending_remaps 2' > {}/$ORCHESTRATE_GPU_UUIDS.health;",
        dir.display()
    );
    let plan = s.write(
        "plan.toml",
        &format!(
            "{}{}",
            stage("remapped", "", &remap),
            stage("next", "after = [\"remapped\"]", "")
        ),
    );
    let run = run_on_fake_gpus(&s, &plan, 2, &dir);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(gpu_of(&run, "remapped"), "GPU-fake-0");
    let gpu = &run.stage("remapped")["gpu"][0];
    assert_eq!(
        gpu["unhealthy"], "2 row remap(s) pending a GPU reset",
        "{gpu}"
    );
    assert!(
        run.stderr
            .contains("remapped: GPU GPU-fake-0 after the stage: 2 row remap(s) pending"),
        "{}",
        run.stderr
    );
    assert_eq!(gpu_of(&run, "next"), "GPU-fake-1");
}
