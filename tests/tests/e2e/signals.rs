//! Stopping `orchestrate`: Ctrl-C stops stages gracefully; `kill -9` of the orchestrator
//! leaves no stage process behind.

use e2e_tests::{processes_with_env, spawn_plan, wait_for, Scratch};
use std::time::{Duration, Instant};

fn plan_with_tree(s: &Scratch, marker: &str) -> std::path::PathBuf {
    s.write(
        "plan.toml",
        &format!(
            r#"
[run]
grace = "2s"
[[stage]]
name = "tree"
command = ["sh", "-c", "sleep 300 & setsid sleep 301 & (sleep 302 &); echo started > {{output}}/started; wait"]
env = {{ MARKER = "{marker}" }}
[[stage]]
name = "after-tree"
after = ["tree"]
command = ["true"]
"#
        ),
    )
}

#[test]
fn sigint_stops_running_stages_and_exits_130() {
    let s = Scratch::new("sigint");
    let marker = format!("sigint-{}", std::process::id());
    let plan = plan_with_tree(&s, &marker);
    let (mut child, run_dir) = spawn_plan(&s, &plan);
    let started = run_dir.join("stages/tree/output/started");
    assert!(
        wait_for(Duration::from_secs(20), || started.exists()),
        "stage started"
    );
    assert!(wait_for(Duration::from_secs(5), || processes_with_env(
        &format!("MARKER={marker}")
    )
    .len()
        >= 4));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        processes_with_env(&format!("MARKER={marker}")).is_empty(),
        "every process of the stage is gone"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("report.json")).unwrap())
            .unwrap();
    assert_eq!(report["status"], "interrupted");
    assert_eq!(report["stages"][0]["status"], "cancelled");
    assert_eq!(report["stages"][1]["status"], "skipped");
}

#[test]
fn kill_9_of_orchestrate_leaves_no_stage_process_after_one_second() {
    let s = Scratch::new("kill9");
    let marker = format!("kill9-{}", std::process::id());
    let plan = plan_with_tree(&s, &marker);
    let (mut child, run_dir) = spawn_plan(&s, &plan);
    let started = run_dir.join("stages/tree/output/started");
    assert!(
        wait_for(Duration::from_secs(20), || started.exists()),
        "stage started"
    );
    let needle = format!("MARKER={marker}");
    assert!(wait_for(Duration::from_secs(5), || processes_with_env(
        &needle
    )
    .len()
        >= 4));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed_at = Instant::now();
    assert!(
        wait_for(Duration::from_secs(1), || processes_with_env(&needle)
            .is_empty()),
        "stage processes still alive 1 s after kill -9: {:?}",
        processes_with_env(&needle)
    );
    eprintln!(
        "all stage processes gone {:?} after kill -9",
        killed_at.elapsed()
    );
    // The journal is intact: every line parses.
    let journal = std::fs::read_to_string(run_dir.join("journal.jsonl")).unwrap();
    for line in journal.lines() {
        serde_json::from_str::<serde_json::Value>(line).expect("journal line parses");
    }
}

#[test]
fn a_second_sigint_kills_stages_that_ignore_sigterm_without_waiting_for_the_grace() {
    let s = Scratch::new("sigint2");
    let marker = format!("sigint2-{}", std::process::id());
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[run]
grace = "60s"
[[stage]]
name = "stubborn"
command = ["sh", "-c", "trap '' TERM; echo up > {{output}}/up; while true; do sleep 0.05; done"]
env = {{ MARKER = "{marker}" }}
"#
        ),
    );
    let (mut child, run_dir) = spawn_plan(&s, &plan);
    let up = run_dir.join("stages/stubborn/output/up");
    assert!(wait_for(Duration::from_secs(20), || up.exists()));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first SIGINT waits for the 60 s grace"
    );
    let second = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        second.elapsed() < Duration::from_secs(5),
        "the second SIGINT kills at once"
    );
    assert!(processes_with_env(&format!("MARKER={marker}")).is_empty());
}
