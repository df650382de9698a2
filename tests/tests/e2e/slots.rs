//! A stage's slot under `max_parallel`: given back once its processes are gone (before its
//! outputs are verified and its end recorded, so the next stage starts sooner), never before,
//! and its downstream stages still wait for its verdict.

use e2e_tests::{run_plan, Scratch};

#[test]
fn one_at_a_time_means_one_stage_tree_at_a_time_and_downstream_waits_for_the_verdict() {
    let s = Scratch::new("slots");
    let trace = s.path().join("trace");
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[run]
max_parallel = 1

[[stage]]
name = "work"
matrix = {{ n = [1, 2, 3, 4, 5, 6] }}
# A background child outlives the first process until it is stopped (and says so): the slot
# must wait for it to be gone. The `mkdir` makes "end" one line per instance: a SIGTERM that
# lands on the shell's fork for `sleep` before that fork has dropped the trap runs it too.
command = ["sh", "-c", "echo start >> {trace}; (trap 'mkdir {{output}}/ended 2>/dev/null && echo end >> {trace}; exit 0' TERM; touch {{output}}/ready; sleep 5 & wait) & while [ ! -e {{output}}/ready ]; do sleep 0.01; done"]

[[stage]]
name = "no_output"
command = ["true"]
outputs = ["promised.txt"]

[[stage]]
name = "after_no_output"
after = ["no_output"]
command = ["sh", "-c", "echo ran > {{output}}/ran"]
"#,
            trace = trace.display()
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    // Every work instance's tree was gone before the next one started.
    let lines: Vec<String> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 12, "{lines:?}");
    for pair in lines.chunks(2) {
        assert_eq!(pair, ["start", "end"], "trees overlapped: {lines:?}");
    }
    for n in 1..=6 {
        let stage = run.stage(&format!("work[n={n}]"));
        assert_eq!(stage["status"], "succeeded", "{stage}");
    }
    // Exit 0 freed the slot early, but the missing output failed the stage, and the stage
    // after it did not run.
    assert_eq!(run.stage("no_output")["status"], "failed");
    assert_eq!(run.stage("after_no_output")["status"], "skipped");
    assert!(!run
        .run_dir
        .join("stages/after_no_output/output/ran")
        .exists());
}
