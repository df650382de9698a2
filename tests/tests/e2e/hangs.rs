//! Hangs get a verdict: a stage that stops making progress is `hung` within its
//! `stall_timeout`, its processes' stacks saved before it is stopped; a stage that prints
//! nothing but computes, and one that persists its checkpoint longer than the window, are not.

use e2e_tests::{
    framework_python, orchestrate_with, processes_with_env, run_plan, RunResult, Scratch,
};

/// Two ranks under torchrun (gloo): both all-reduce and rank 0 reports each step; then rank 1
/// skips the next all-reduce and sleeps, so rank 0 waits in it for ever.
const SKIPPED_ALL_REDUCE: &str = r#"
import time, torch, torch.distributed as dist
import orchestrate_stage as stage
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
for step in (1, 2):
    dist.all_reduce(t)
    if rank == 0:
        stage.progress(step, total_steps=10)
if rank == 1:
    time.sleep(3600)
dist.all_reduce(t)
"#;

fn stage_events_t(run: &RunResult, stage: &str) -> Vec<(String, f64)> {
    std::fs::read_to_string(run.run_dir.join("stages").join(stage).join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|e| {
            (
                e["event"]["event"].as_str().unwrap_or("").to_string(),
                e["t"].as_f64().unwrap_or(0.0) / 1000.0,
            )
        })
        .collect()
}

#[test]
fn a_rank_that_skips_an_all_reduce_is_hung_with_both_ranks_stacks_and_nothing_left() {
    let Some(python) = framework_python() else {
        return;
    };
    let s = Scratch::new("hang-torchrun");
    let script = s.write("rank.py", SKIPPED_ALL_REDUCE);
    let marker = format!("hang-{}", std::process::id());
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[[stage]]
name = "ddp"
command = ["python3", "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "{{master_port}}", "{script}"]
stall_timeout = "4s"
env = {{ MARKER = "{marker}" }}
"#,
            script = script.display()
        ),
    );
    let run = e2e_tests::run_plan_with(orchestrate_with(&python), &s, &plan, &[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let stage = run.stage("ddp");
    assert_eq!(stage["failure"], "hung", "{stage}");
    let error = stage["error"].as_str().unwrap();
    assert!(
        error.contains("no progress for 4s (last step 2)"),
        "{error}"
    );
    assert!(run.stderr.contains("ddp: hung:"), "{}", run.stderr);

    // Judged within the window and a look's period of the last progress, stopped at once.
    let events = stage_events_t(&run, "ddp");
    let last_progress = events
        .iter()
        .filter(|(e, _)| e == "progress")
        .map(|(_, t)| *t)
        .next_back()
        .expect("rank 0 reported progress");
    let exited = stage["timing"]["exited"].as_f64().unwrap();
    assert!(
        exited - last_progress < 4.0 + 10.0,
        "hung {:.1} s after the last progress",
        exited - last_progress
    );

    // The evidence: every process listed, and each rank's stacks, rank 0's inside the
    // all-reduce it waits in.
    let dir = run.run_dir.join("stages/ddp/hung-1");
    let listing = std::fs::read_to_string(dir.join("processes.txt")).unwrap();
    assert!(
        listing.lines().count() >= 3,
        "torchrun and two ranks: {listing}"
    );
    let stacks: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("stack-"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    let ranks: Vec<&String> = stacks.iter().filter(|s| s.contains("(rank.py:")).collect();
    assert_eq!(ranks.len(), 2, "both ranks' stacks: {stacks:?}");
    assert!(
        ranks.iter().any(|s| s.contains("all_reduce")),
        "rank 0 waits in the all-reduce: {ranks:?}"
    );
    assert!(
        processes_with_env(&format!("MARKER={marker}")).is_empty(),
        "no process of the stage is left"
    );
}

#[test]
fn a_silent_stage_that_computes_and_one_persisting_past_the_window_are_not_hung() {
    let s = Scratch::new("hang-not");
    // Prints nothing, reports nothing, computes for 4 s; and a stage that said `finishing`
    // (persisting its checkpoint) and then takes 4 s, under a 2 s window.
    let persisting = s.write(
        "persisting.py",
        "import json, os, socket, time\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.connect(os.environ['ORCHESTRATE_EVENTS'])\n\
         for e in ({'event': 'progress', 'step': 1}, {'event': 'finishing'}):\n\
         \x20   s.sendall((json.dumps(dict(e, v=1)) + '\\n').encode())\n\
         time.sleep(4)\n",
    );
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[run]
stall_timeout = "2s"

[[stage]]
name = "busy"
command = ["python3", "-c", "import time\nend = time.time() + 4\nwhile time.time() < end: pass"]

[[stage]]
name = "persisting"
command = ["python3", "{persisting}"]

[[stage]]
name = "stuck"
command = ["sleep", "30"]
stall_timeout = "2s"
"#,
            persisting = persisting.display()
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.stage("busy")["status"], "succeeded", "{}", run.stderr);
    assert_eq!(
        run.stage("persisting")["status"],
        "succeeded",
        "{}",
        run.stderr
    );
    // A silent stage that neither computes nor writes is hung, and says it has no stacks to
    // show when it is not Python.
    let stuck = run.stage("stuck");
    assert_eq!(stuck["failure"], "hung", "{stuck}");
    assert!(
        stuck["timing"]["exited"].as_f64().unwrap() - stuck["timing"]["spawned"].as_f64().unwrap()
            < 15.0
    );
    let listing =
        std::fs::read_to_string(run.run_dir.join("stages/stuck/hung-1/processes.txt")).unwrap();
    assert!(listing.contains("(sleep)"), "{listing}");
}
