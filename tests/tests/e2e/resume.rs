//! Durable runs: `kill -9` at many instants and `--resume` each time; a torn journal tail and a
//! corrupted output; an edited stage reruns with its downstream only.

use e2e_tests::{orchestrate, processes_with_env, repo_root, run_plan, Scratch};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Every complete journal line parses; returns the records.
fn journal(run_dir: &Path) -> Vec<Value> {
    let Ok(text) = std::fs::read_to_string(run_dir.join("journal.jsonl")) else {
        return Vec::new(); // killed before the journal existed
    };
    let lines: Vec<&str> = text.split('\n').collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            Ok(v) => out.push(v),
            Err(e) => assert_eq!(
                i + 1,
                lines.len(),
                "only a torn last line may fail to parse: {e}: {line}"
            ),
        }
    }
    out
}

/// Asserts that no stage was started again after the journal recorded it as succeeded.
fn assert_no_finished_stage_reran(records: &[Value]) {
    let mut finished: HashMap<String, usize> = HashMap::new();
    for (n, r) in records.iter().enumerate() {
        let stage = r["stage"].as_str().unwrap_or_default().to_string();
        match r["rec"].as_str().unwrap() {
            "stage_finished" if r["status"] == "succeeded" => {
                finished.entry(stage).or_insert(n);
            }
            "stage_started" => assert!(
                !finished.contains_key(&stage),
                "stage {stage} started again (record {n}) after it had succeeded (record {})",
                finished[&stage]
            ),
            _ => {}
        }
    }
}

fn starts(records: &[Value], stage: &str) -> usize {
    records
        .iter()
        .filter(|r| r["rec"] == "stage_started" && r["stage"] == stage)
        .count()
}

#[test]
fn kill_9_at_30_instants_and_resume_never_reruns_a_finished_stage() {
    let s = Scratch::new("kill-resume");
    let marker = format!("kill-resume-{}", std::process::id());
    let counts = s.path().join("counts");
    std::fs::create_dir_all(&counts).unwrap();
    let mut plan = String::from("[run]\ngrace = \"1s\"\n");
    for i in 0..8 {
        plan.push_str(&format!(
            "[[stage]]\nname = \"s{i}\"\ncommand = [\"sh\", \"-c\", \"sleep 0.12; echo run >> {c}/s{i}; echo ok > {{output}}/out\"]\noutputs = [\"out\"]\nenv = {{ MARKER = \"{marker}\" }}\n{after}",
            c = counts.display(),
            after = if i > 0 { format!("after = [\"s{}\"]\n", i - 1) } else { String::new() }
        ));
    }
    let plan = s.write("plan.toml", &plan);
    let run_dir = s.path().join("run");
    let delays = [15u64, 45, 80, 110, 140, 170, 30, 95, 125, 60];
    let mut finished_early = false;
    for k in 0..30 {
        let mut cmd = Command::new(orchestrate());
        cmd.arg("--plan")
            .arg(&plan)
            .arg("--run-dir")
            .arg(&run_dir)
            .arg("-q");
        if run_dir.join("journal.jsonl").exists() {
            cmd.arg("--resume");
        }
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delays[k % delays.len()]));
        let _ = child.kill();
        let status = child.wait().unwrap();
        if status.code() == Some(0) {
            finished_early = true;
            break;
        }
        let records = journal(&run_dir);
        assert_no_finished_stage_reran(&records);
        // kill -9 of the orchestrator takes every stage process with it.
        let needle = format!("MARKER={marker}");
        for _ in 0..100 {
            if processes_with_env(&needle).is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(processes_with_env(&needle).is_empty(), "after kill {k}");
    }
    let out = Command::new(orchestrate())
        .arg("resume")
        .arg(&run_dir)
        .arg("-q")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("report.json")).unwrap())
            .unwrap();
    for st in report["stages"].as_array().unwrap() {
        assert_eq!(st["status"], "succeeded", "{st}");
    }
    let records = journal(&run_dir);
    assert_no_finished_stage_reran(&records);
    let resumed = records
        .iter()
        .filter(|r| r["rec"] == "run_started" && r["resumed"] == true)
        .count();
    eprintln!("{resumed} resumes, finished early: {finished_early}");
    assert!(
        resumed >= 10,
        "the kills interrupted the run many times ({resumed})"
    );
    // Resuming a finished run runs nothing.
    let before = records
        .iter()
        .filter(|r| r["rec"] == "stage_started")
        .count();
    let out = Command::new(orchestrate())
        .arg("resume")
        .arg(&run_dir)
        .arg("-q")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let after = journal(&run_dir)
        .iter()
        .filter(|r| r["rec"] == "stage_started")
        .count();
    assert_eq!(before, after);
}

#[test]
fn a_torn_journal_is_repaired_and_a_corrupted_output_reruns_its_stage() {
    let s = Scratch::new("torn");
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "a"
command = ["sh", "-c", "echo a > {output}/a.txt"]
outputs = ["a.txt"]
[[stage]]
name = "b"
after = ["a"]
command = ["sh", "-c", "cat {input.a}/a.txt > {output}/b.txt"]
outputs = ["b.txt"]
[[stage]]
name = "c"
after = ["b"]
command = ["sh", "-c", "cat {input.b}/b.txt > {output}/c.txt"]
outputs = ["c.txt"]
"#,
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // Same size, other content: only the checksum can tell.
    std::fs::write(run.run_dir.join("stages/b/output/b.txt"), "z\n").unwrap();
    let mut j = std::fs::OpenOptions::new()
        .append(true)
        .open(run.run_dir.join("journal.jsonl"))
        .unwrap();
    std::io::Write::write_all(&mut j, br#"{"v":1,"t":1,"rec":"stage_sta"#).unwrap();
    drop(j);

    let status = Command::new(orchestrate())
        .arg("status")
        .arg(&run.run_dir)
        .output()
        .unwrap();
    let status_text = String::from_utf8_lossy(&status.stdout);
    assert!(status_text.contains("corrupted"), "{status_text}");

    let out = Command::new(orchestrate())
        .arg("resume")
        .arg(&run.run_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("torn"), "the repair is reported: {stderr}");
    assert!(stderr.contains("b.txt is corrupted"), "{stderr}");
    let records = journal(&run.run_dir);
    assert!(
        records.iter().all(|r| r.is_object()),
        "every line parses after the repair"
    );
    assert_eq!(starts(&records, "a"), 1, "a is kept");
    assert_eq!(starts(&records, "b"), 2, "b reruns");
    assert_eq!(starts(&records, "c"), 2, "c, downstream of b, reruns");
    assert_eq!(
        std::fs::read_to_string(run.run_dir.join("stages/c/output/c.txt")).unwrap(),
        "a\n"
    );
}

#[test]
fn editing_one_stage_of_the_quickstart_reruns_it_and_its_downstream_only() {
    let s = Scratch::new("edit");
    // The quickstart's stages with few steps, so the test is quick on a CPU.
    let quick = std::fs::read_to_string(repo_root().join("configs/quickstart.toml"))
        .unwrap()
        .replace("steps = 300", "steps = 3")
        .replace("steps = 200", "steps = 3");
    let plan = s.write("plan.toml", &quick);
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);

    let edited = quick.replacen("steps = 3\nbatch_size", "steps = 4\nbatch_size", 1);
    assert_ne!(edited, quick, "the SFT stage's steps were edited");
    s.write("plan.toml", &edited);
    let status = Command::new(orchestrate())
        .args(["status"])
        .arg(&run.run_dir)
        .arg("--plan")
        .arg(&plan)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("sft") && text.contains("definition in the plan changed"),
        "{text}"
    );
    let out = Command::new(orchestrate())
        .arg("--plan")
        .arg(&plan)
        .arg("--run-dir")
        .arg(&run.run_dir)
        .arg("--resume")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records = journal(&run.run_dir);
    assert_eq!(starts(&records, "pretrain"), 1, "pretrain kept");
    assert_eq!(starts(&records, "eval-pretrain"), 1, "eval-pretrain kept");
    assert_eq!(starts(&records, "sft"), 2, "sft reruns");
    assert_eq!(
        starts(&records, "eval"),
        2,
        "eval, downstream of sft, reruns"
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(run.run_dir.join("report.json")).unwrap())
            .unwrap();
    let sft = report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "sft")
        .unwrap()
        .clone();
    assert_eq!(sft["metrics"]["steps"], 4.0);
    let kept = report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "pretrain")
        .unwrap()
        .clone();
    assert_eq!(kept["status"], "succeeded");
    assert!(
        kept["metrics"]["final_loss"].is_number(),
        "a kept stage keeps its metrics: {kept}"
    );
}

/// A built-in `train` stage of 24 steps, slow enough on the CPU (a few hundred ms a step) that
/// a stop asked at step 16 lands before its end.
const TRAIN_24: &str = r#"[[stage]]
name = "train"
kind = "train"
[stage.params]
data = "synthetic:pretrain"
steps = 24
batch_size = 16
seq_len = 64
lr = 0.01
warmup_steps = 2
seed = 3
progress_every_s = 0.001
model = { d_model = 128, n_layers = 2, n_heads = 4, max_seq_len = 64 }
"#;

/// The highest step the train stage reported on its channel so far.
fn reported_step(run_dir: &Path) -> u64 {
    std::fs::read_to_string(run_dir.join("stages/train/events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"]["event"] == "progress")
        .filter_map(|e| e["event"]["step"].as_u64())
        .max()
        .unwrap_or(0)
}

#[test]
fn a_train_stage_stopped_in_its_last_ten_steps_and_resumed_reports_the_uninterrupted_losses() {
    // Before: `final_loss` averaged only the steps after the resume, and `first_loss` was the
    // resumed attempt's first step (the window of losses was not in the checkpoint).
    let straight = Scratch::new("resume-losses-straight");
    let plan = straight.write("plan.toml", TRAIN_24);
    let uninterrupted = run_plan(&straight, &plan, &[]);
    assert_eq!(uninterrupted.code, Some(0), "{}", uninterrupted.stderr);

    let s = Scratch::new("resume-losses-stopped");
    let plan = s.write("plan.toml", TRAIN_24);
    let (mut child, run_dir) = e2e_tests::spawn_plan(&s, &plan);
    assert!(
        e2e_tests::wait_for(Duration::from_secs(120), || reported_step(&run_dir) >= 16),
        "training reported step 16"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(
        child.wait().unwrap().code(),
        Some(130),
        "stopped mid-training"
    );
    let out = Command::new(orchestrate())
        .arg("resume")
        .arg(&run_dir)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = e2e_tests::read_report(&run_dir);
    let metrics = &e2e_tests::report_stage(&report, "train")["metrics"];
    let resumed_from = metrics["resumed_from_step"].as_f64().unwrap_or(0.0);
    assert!(
        (15.0..24.0).contains(&resumed_from),
        "resumed within the last ten steps: {metrics}"
    );
    for metric in ["final_loss", "first_loss"] {
        let want = uninterrupted.metric("train", metric);
        let got = metrics[metric].as_f64().unwrap();
        assert!(
            (got - want).abs() <= 1e-4,
            "{metric}: resumed {got}, uninterrupted {want} (resumed from step {resumed_from})"
        );
    }
}
