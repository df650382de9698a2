//! The GPU handed on at release: a Python command stage that reports `stage.released()` gives
//! its GPU to a waiting stage while it still persists its outputs, a release that NVML (here
//! the fake GPUs' holder files) contradicts is refused, a stage back on its released GPU is a
//! leak, and a crash of `orchestrate` anywhere between the release and the checkpoint's
//! durability never lets a resume use a partial checkpoint or run a finished stage again.

use e2e_tests::{
    fake_gpu_command, journal_records, orchestrate, read_report, repo_root, succeeded_stages,
    wait_for, Scratch,
};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs `cmd` with its console read as it comes: when a line contains `trigger`, creates
/// `go` (a stage waits for it). Whether the trigger came, the exit status and the console.
fn run_answering(mut cmd: Command, trigger: &str, go: &Path) -> (bool, Option<i32>, String) {
    let mut run = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = false;
    let mut lines = Vec::new();
    for line in BufReader::new(run.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if !seen && line.contains(trigger) {
            seen = true;
            std::fs::write(go, "").unwrap();
        }
        lines.push(line);
    }
    let status = run.wait().unwrap();
    (seen, status.code(), lines.join("\n"))
}

/// The helper's directory, for a stage's PYTHONPATH.
fn helper_path() -> String {
    repo_root().join("python").display().to_string()
}

/// A one-stage plan on the fake GPU: stage `a` runs `body` (Python, after the helper's import,
/// with `holder`, its fake GPU's holder file, and `go`, a file the test creates when it saw
/// what it waits for). `run` is the plan's `[run]` table's body. Returns the plan, the holders'
/// directory and `go`.
fn one_stage_plan(
    s: &Scratch,
    run: &str,
    body: &str,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let holders = s.path().join("holders");
    let holder = holders.join("GPU-fake-0");
    let go = s.path().join("go");
    let script = s.write(
        "a.py",
        &format!(
            "import os, sys, time\nimport orchestrate_stage as stage\nholder, go = sys.argv[1:3]\n{body}"
        ),
    );
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"[run]
{run}
[[stage]]
name = "a"
gpus = 1
command = ["python3", "{script}", "{holder}", "{go}"]
env = {{ PYTHONPATH = "{path}" }}
"#,
            script = script.display(),
            holder = holder.display(),
            go = go.display(),
            path = helper_path(),
        ),
    );
    (plan, holders, go)
}

/// Stage `a` of the hand-on test: takes 1 GiB of the fake GPU, reports a release while the
/// holder file still shows it (refused), waits for the test to say it saw the refusal, gives
/// the memory back and releases again (this one holds), then waits for stage `b` to start on
/// the GPU before it writes its checkpoint and exits: it can only finish if `b` started while
/// it was still running.
const HAND_ON: &str = r#"
import os, sys, time
import orchestrate_stage as stage
holder, go, b_started = sys.argv[1:4]
with open(holder, "w") as f:
    f.write(f"{os.getpid()} python3 {1 << 30}\n")
stage.released()
deadline = time.time() + 20
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.01)
open(holder, "w").close()
stage.released()
while not os.path.exists(b_started) and time.time() < deadline:
    time.sleep(0.01)
out = stage.output_dir() / "model.bin"
with open(str(out) + ".tmp", "wb") as f:
    f.write(b"seen b" if os.path.exists(b_started) else b"no b")
os.replace(str(out) + ".tmp", out)
stage.checkpoint(out)
"#;

#[test]
fn a_released_gpu_goes_to_the_waiting_stage_before_the_releaser_exits_and_a_contradicted_release_is_refused(
) {
    let s = Scratch::new("release-hand-on");
    let holders = s.path().join("holders");
    let (go, b_started) = (s.path().join("go"), s.path().join("b-started"));
    let script = s.write("a.py", HAND_ON);
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"[run]
max_parallel = 2

[[stage]]
name = "a"
gpus = 1
command = ["python3", "{script}", "{holder}", "{go}", "{b}"]
outputs = ["model.bin"]
env = {{ PYTHONPATH = "{path}" }}

[[stage]]
name = "b"
gpus = 1
command = ["sh", "-c", "touch {b}"]
"#,
            script = script.display(),
            holder = holders.join("GPU-fake-0").display(),
            go = go.display(),
            b = b_started.display(),
            path = helper_path(),
        ),
    );
    let trigger = "release does not hold";
    let (refused, code, console) =
        run_answering(fake_gpu_command(&s, &plan, "1", &holders), trigger, &go);
    assert_eq!(code, Some(0), "{console}");
    assert!(refused, "no refusal on the console:\n{console}");
    let refusal = console.lines().find(|l| l.contains(trigger)).unwrap();
    assert!(
        refusal.contains("a:")
            && refusal.contains("GPU-fake-0")
            && refusal.contains("process of the stage"),
        "{refusal}"
    );
    assert!(console.contains("a: released GPU-fake-0"), "{console}");
    let run_dir = s.path().join("run");
    let model = std::fs::read_to_string(run_dir.join("stages/a/output/model.bin")).unwrap();
    assert_eq!(
        model, "seen b",
        "a saw b start before it wrote its checkpoint"
    );
    // The journal: b started before a's end was recorded.
    let records = journal_records(&run_dir);
    let at = |rec: &str, stage: &str| {
        records
            .iter()
            .position(|r| r["rec"] == rec && r["stage"] == stage)
            .unwrap_or_else(|| panic!("no {rec} of {stage}: {records:?}"))
    };
    assert!(
        at("stage_started", "b") < at("stage_finished", "a"),
        "{records:?}"
    );
    // The report: a's verdict was taken at release, and b was spawned before a's first
    // process exited.
    let report = read_report(&run_dir);
    let stage = |name: &str| {
        report["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|st| st["name"] == name)
            .unwrap()
            .clone()
    };
    let (a, b) = (stage("a"), stage("b"));
    assert_eq!(a["gpu"][0]["verdict"], "clean", "{a}");
    assert_eq!(a["gpu"][0]["at_release"], true, "{a}");
    let released = a["timing"]["released"].as_f64().expect("a released");
    let a_exited = a["timing"]["exited"].as_f64().unwrap();
    let b_spawned = b["timing"]["spawned"].as_f64().unwrap();
    assert!(released < b_spawned && b_spawned < a_exited, "{a}\n{b}");
}

#[test]
fn a_stage_back_on_its_released_gpu_is_a_leak() {
    let s = Scratch::new("release-touch-again");
    // Released (the holder file is empty), then, once the release held, back on the GPU.
    let (plan, holders, go) = one_stage_plan(
        &s,
        "on_leak = \"warn\"",
        r#"stage.released()
deadline = time.time() + 20
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.01)
with open(holder, "w") as f:
    f.write(f"{os.getpid()} python3 {1 << 30}\n")
"#,
    );
    let (held, _, text) = run_answering(
        fake_gpu_command(&s, &plan, "1", &holders),
        "a: released",
        &go,
    );
    assert!(held, "{text}");
    let report = read_report(&s.path().join("run"));
    let gpu = &report["stages"][0]["gpu"][0];
    assert_eq!(gpu["verdict"], "leaked", "{gpu}\n{text}");
    assert_eq!(gpu["at_release"], true, "{gpu}");
    assert!(
        gpu["note"]
            .as_str()
            .unwrap_or("")
            .contains("used the GPU again"),
        "{gpu}"
    );
}

/// Stage `a` of the crash test: releases (its GPU is clean), then persists its checkpoint in
/// chunks (temporary file, fsync, rename, then the report of its checksum) over about half a
/// second. Stage `b` after it checks every byte it was given.
const PERSIST: &str = r#"
import hashlib, os, sys, time
import orchestrate_stage as stage
released_mark = sys.argv[1]
stage.released()
open(released_mark, "a").close()
out = stage.output_dir() / "model.bin"
tmp = str(out) + ".tmp"
with open(tmp, "wb") as f:
    for i in range(25):
        f.write(bytes([i]) * 65536)
        f.flush()
        time.sleep(0.02)
    os.fsync(f.fileno())
os.replace(tmp, out)
stage.checkpoint(out)
"#;

const CHECK: &str = r#"
import sys
import orchestrate_stage as stage
data = (stage.input_dir("a") / "model.bin").read_bytes()
want = b"".join(bytes([i]) * 65536 for i in range(25))
if data != want:
    sys.exit(f"partial checkpoint: {len(data)} bytes")
(stage.output_dir() / "ok").write_text("ok")
"#;

#[test]
fn a_kill_anywhere_between_release_and_durability_never_resumes_from_a_partial_checkpoint() {
    let instants = 20;
    // Kills that came while `a` was released but not yet recorded finished.
    let mut in_window = 0;
    for k in 0..instants {
        let s = Scratch::new(&format!("release-crash-{k}"));
        let holders = s.path().join("holders");
        let mark = s.path().join("released");
        let persist = s.write("a.py", PERSIST);
        let check = s.write("b.py", CHECK);
        let plan = s.write(
            "plan.toml",
            &format!(
                r#"[[stage]]
name = "a"
gpus = 1
command = ["python3", "{persist}", "{mark}"]
outputs = ["model.bin"]
env = {{ PYTHONPATH = "{path}" }}

[[stage]]
name = "b"
after = ["a"]
gpus = 1
command = ["python3", "{check}"]
outputs = ["ok"]
env = {{ PYTHONPATH = "{path}" }}
"#,
                persist = persist.display(),
                mark = mark.display(),
                check = check.display(),
                path = helper_path(),
            ),
        );
        let mut run = fake_gpu_command(&s, &plan, "1", &holders)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            wait_for(Duration::from_secs(30), || mark.exists()),
            "instant {k}: a never released"
        );
        // Instants from the release to well past the checkpoint's durability (about 0.5 s).
        std::thread::sleep(Duration::from_millis(40 * k));
        let _ = run.kill();
        let _ = run.wait();
        let run_dir = s.path().join("run");
        let before = journal_records(&run_dir);
        let finished_before = succeeded_stages(&before);
        if finished_before.is_empty() {
            in_window += 1;
        }
        let out = Command::new(orchestrate())
            .arg("resume")
            .arg(&run_dir)
            .env("ORCHESTRATE_FAKE_GPUS", "1")
            .env("ORCHESTRATE_FAKE_GPU_DIR", &holders)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "instant {k}: the resume failed:\n{text}"
        );
        let after = journal_records(&run_dir);
        for stage in &finished_before {
            let starts = |records: &[serde_json::Value]| {
                records
                    .iter()
                    .filter(|r| r["rec"] == "stage_started" && r["stage"] == stage.as_str())
                    .count()
            };
            assert_eq!(
                starts(&after),
                starts(&before),
                "instant {k}: {stage} was recorded finished, and ran again"
            );
        }
        // b checked every byte of a's checkpoint; a finished before b began.
        assert!(
            run_dir.join("stages/b/output/ok").exists(),
            "instant {k}: {text}"
        );
        let a_done = after
            .iter()
            .rposition(|r| r["rec"] == "stage_finished" && r["stage"] == "a")
            .unwrap();
        let b_done = after
            .iter()
            .rposition(|r| r["rec"] == "stage_finished" && r["stage"] == "b")
            .unwrap();
        assert!(a_done < b_done, "instant {k}: {after:?}");
    }
    assert!(
        in_window >= instants / 4,
        "only {in_window} of {instants} kills fell between the release and a's recorded end"
    );
}

#[test]
fn a_release_that_never_held_leaves_the_ordinary_verdict_with_the_reason() {
    let s = Scratch::new("release-refused");
    // Released while the holder file still shows the stage's memory; gives it back only once
    // the refusal was seen, as it exits.
    let (plan, holders, go) = one_stage_plan(
        &s,
        "",
        r#"with open(holder, "w") as f:
    f.write(f"{os.getpid()} python3 {1 << 30}\n")
stage.released()
deadline = time.time() + 20
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.01)
open(holder, "w").close()
"#,
    );
    let cmd = fake_gpu_command(&s, &plan, "1", &holders);
    let (refused, code, text) = run_answering(cmd, "release does not hold", &go);
    assert!(refused && code == Some(0), "{text}");
    let report = read_report(&s.path().join("run"));
    let stage = &report["stages"][0];
    let gpu = &stage["gpu"][0];
    assert_eq!(gpu["verdict"], "clean", "{gpu}");
    assert!(gpu.get("at_release").is_none(), "{gpu}");
    assert!(stage["timing"].get("released").is_none(), "{stage}");
    let note = gpu["note"].as_str().unwrap_or("");
    assert!(
        note.contains("not handed on at release") && note.contains("process of the stage"),
        "{gpu}\n{text}"
    );
}
