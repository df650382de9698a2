//! Real training frameworks as stages, on the CPU: Hugging Face `Trainer` and Lightning with
//! the `orchestrate_stage` callbacks, DDP under torchrun (gloo, two processes) and Accelerate,
//! each a shipped example run through the real `orchestrate` binary, each handing its
//! checkpoint to a downstream stage that loads it; and for Trainer and Lightning, a stop by
//! SIGTERM that ends in a saved checkpoint which `--resume` continues from.
//!
//! The Python is `ORCHESTRATE_TEST_PYTHON`, a virtual environment's interpreter with torch,
//! transformers, accelerate, lightning and `./python` installed (scripts/test sets it up with
//! scripts/setup-python-frameworks). Under CI (`CI=true`) a missing one fails every test here;
//! elsewhere the tests fall back to `.venv-frameworks/` and are skipped without it.

use e2e_tests::{framework_python, orchestrate_with, repo_root, RunResult, Scratch};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

/// Runs `plan` to its end into `<scratch>/run` (with `extra` arguments).
fn run(python: &Path, s: &Scratch, plan: &Path, extra: &[&str]) -> RunResult {
    e2e_tests::run_plan_with(orchestrate_with(python), s, plan, extra)
}

/// Every event of a stage (all attempts, in order), without the timestamp wrapper.
fn events(run_dir: &Path, stage: &str) -> Vec<Value> {
    std::fs::read_to_string(run_dir.join("stages").join(stage).join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|e| e["event"].clone())
        .collect()
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The checkpoint record of `file` in the stage's report record.
fn checkpoint_record(run: &RunResult, stage: &str, file: &str) -> Value {
    let record = run.stage(stage);
    record["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"].as_str().is_some_and(|p| p.ends_with(file)))
        .unwrap_or_else(|| panic!("no checkpoint {file} in {record}"))
        .clone()
}

/// Asserts what every example plan promises: exit 0, both stages succeeded, the train stage's
/// `file` recorded with the SHA-256 the script reported (it hashed the file as it wrote it),
/// and the downstream stage's eval.json naming that very checksum under `hash_key`.
fn assert_handed_downstream(run: &RunResult, file: &str, hash_key: &str) -> Value {
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stage("train")["status"], "succeeded");
    assert_eq!(run.stage("evaluate")["status"], "succeeded");
    let recorded = checkpoint_record(run, "train", file);
    assert!(recorded["sha256"].is_string(), "{recorded}");
    let eval = read_json(&run.run_dir.join("stages/evaluate/output/eval.json"));
    assert_eq!(
        eval[hash_key], recorded["sha256"],
        "the evaluation loaded exactly the recorded checkpoint"
    );
    let loss = run.metric("evaluate", "eval_loss");
    assert!(
        loss < 3.0,
        "the handed-down model learned (uniform over bytes is 5.55): {loss}"
    );
    eval
}

#[test]
fn hf_trainer_reports_through_the_callback_and_hands_its_model_downstream() {
    let Some(python) = framework_python() else {
        return;
    };
    let s = Scratch::new("fw-hf");
    let run = run(
        &python,
        &s,
        &repo_root().join("examples/hf-trainer/plan.toml"),
        &[],
    );
    assert_handed_downstream(&run, "model.safetensors", "weights_sha256");
    // From on_log: the last logged loss and learning rate; from on_train_end: the step.
    assert!(run.metric("train", "loss") < 3.0);
    assert!(run.stage("train")["metrics"]["learning_rate"].is_number());
    assert_eq!(run.metric("train", "global_step"), 120.0);
    assert!(
        run.stderr.contains("train: step 120/120"),
        "progress reached the console"
    );
    // From on_save: each file of Trainer's checkpoint-40, hashed and reported with its step.
    let saved: Vec<Value> = events(&run.run_dir, "train")
        .into_iter()
        .filter(|e| e["event"] == "checkpoint" && e["step"] == 40)
        .collect();
    assert!(
        saved.iter().any(|e| e["path"]
            .as_str()
            .unwrap()
            .ends_with("checkpoint-40/model.safetensors")),
        "{saved:?}"
    );
    assert!(saved
        .iter()
        .any(|e| e["path"].as_str().unwrap().ends_with("optimizer.pt")));
}

#[test]
fn lightning_reports_through_the_callback_and_hands_its_model_downstream() {
    let Some(python) = framework_python() else {
        return;
    };
    let s = Scratch::new("fw-lightning");
    let run = run(
        &python,
        &s,
        &repo_root().join("examples/lightning/plan.toml"),
        &[],
    );
    let eval = assert_handed_downstream(&run, "model.ckpt", "checkpoint_sha256");
    assert_eq!(
        eval["global_step"], 150,
        "the final checkpoint was evaluated"
    );
    // callback_metrics: what the module logs.
    assert!(run.metric("train", "train_loss") < 3.0);
    assert!(run.metric("train", "val_loss") < 3.0);
    assert_eq!(run.metric("train", "global_step"), 150.0);
    // ModelCheckpoint's every-50-steps files were reported as they appeared.
    let reported: Vec<String> = events(&run.run_dir, "train")
        .iter()
        .filter(|e| e["event"] == "checkpoint")
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    assert!(
        reported.iter().any(|p| p.ends_with("step=100.ckpt")),
        "{reported:?}"
    );
}

#[test]
fn torchrun_ddp_with_two_gloo_processes_hands_its_model_downstream() {
    let Some(python) = framework_python() else {
        return;
    };
    let s = Scratch::new("fw-torchrun");
    let run = run(
        &python,
        &s,
        &repo_root().join("examples/torchrun/plan.toml"),
        &[],
    );
    let eval = assert_handed_downstream(&run, "model.pt", "checkpoint_sha256");
    assert_eq!(eval["step"], 150);
    assert_eq!(
        run.metric("train", "world_size"),
        2.0,
        "two ranks trained together"
    );
    // Only rank 0 reported: one start.
    let starts = events(&run.run_dir, "train")
        .iter()
        .filter(|e| e["event"] == "started")
        .count();
    assert_eq!(starts, 1);
}

#[test]
fn accelerate_pretrain_then_sft_from_its_checkpoint_on_the_cpu() {
    let Some(python) = framework_python() else {
        return;
    };
    let s = Scratch::new("fw-accelerate");
    // Seed 000's plan (configs/seed000-accelerate.toml) at a CPU's size: the same script and
    // launcher, fewer and smaller steps.
    let script = repo_root().join("examples/accelerate/train_accelerate.py");
    let launch = r#""python3", "-m", "accelerate.commands.launch", "--num_processes", "1""#;
    let small = r#""--steps", "6", "--batch", "4", "--seq", "32""#;
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[[stage]]
name = "pretrain"
command = [{launch}, "{script}", "--phase", "pretrain", {small}, "--out", "{{output}}"]
outputs = ["model.safetensors", "config.json"]

[[stage]]
name = "sft"
after = ["pretrain"]
command = [{launch}, "{script}", "--phase", "sft", "--init", "{{input.pretrain}}", {small}, "--out", "{{output}}"]
outputs = ["model.safetensors", "config.json"]
"#,
            script = script.display()
        ),
    );
    let run = run(&python, &s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for stage in ["pretrain", "sft"] {
        assert_eq!(run.stage(stage)["status"], "succeeded");
        assert_eq!(run.metric(stage, "steps"), 6.0);
        checkpoint_record(&run, stage, "model.safetensors");
    }
    // SFT started from exactly the weights pretrain saved (their fingerprint matches), and not
    // from a fresh model (whose fingerprint pretrain reported before its first step).
    let saved = run.metric("pretrain", "final_weight_sum");
    let fresh = run.metric("pretrain", "init_weight_sum");
    let began = run.metric("sft", "init_weight_sum");
    assert!(
        (began - saved).abs() <= 1e-9 * saved.abs(),
        "sft began from weights summing to {began}, pretrain saved {saved}"
    );
    assert!(
        (began - fresh).abs() > 1e-6 * fresh.abs(),
        "sft began from a fresh model ({began} = {fresh})"
    );
}

/// Starts `plan` in the background (output discarded).
fn spawn(python: &Path, s: &Scratch, plan: &Path) -> (Child, PathBuf) {
    let run_dir = s.path().join("run");
    let child = orchestrate_with(python)
        .arg("--plan")
        .arg(plan)
        .arg("--run-dir")
        .arg(&run_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("orchestrate starts");
    (child, run_dir)
}

/// Runs a one-stage plan of `script` for `steps` steps, stops it with SIGTERM to
/// `orchestrate` once training has reported step 10, checks that the stage saved a checkpoint
/// and exited 75, then resumes the run and checks that the second attempt continued from that
/// checkpoint's step to the end. Returns the resumed run and the step the stop saved.
fn stop_and_resume(
    python: &Path,
    s: &Scratch,
    script: &str,
    extra: &str,
    steps: u64,
    output: &str,
) -> (RunResult, u64) {
    let script = repo_root().join(script);
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\ngrace = \"60s\"\n[[stage]]\nname = \"train\"\ncommand = [\"python3\", \"{}\", \"--steps\", \"{steps}\"{extra}]\noutputs = [\"{output}\"]\n",
            script.display()
        ),
    );
    let (mut child, run_dir) = spawn(python, s, &plan);
    let training = e2e_tests::wait_for(Duration::from_secs(120), || {
        events(&run_dir, "train")
            .iter()
            .any(|e| e["event"] == "progress" && e["step"].as_u64() >= Some(10))
    });
    assert!(training, "training reported step 10");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(130), "a stopped run");
    let report = e2e_tests::read_report(&run_dir);
    let stopped = e2e_tests::report_stage(&report, "train");
    assert_eq!(stopped["status"], "cancelled");
    assert_eq!(
        stopped["exit_code"], 75,
        "stopped with a resumable checkpoint: {stopped}"
    );
    let before = events(&run_dir, "train");
    let failed = before
        .iter()
        .find(|e| e["event"] == "failed")
        .expect("the stop was reported");
    assert_eq!(failed["reason"], "interrupted");
    let saved = before
        .iter()
        .filter(|e| e["event"] == "checkpoint")
        .filter_map(|e| e["step"].as_u64())
        .max()
        .expect("the stop's checkpoint was reported");
    assert!(
        (10..steps).contains(&saved),
        "stopped mid-training: step {saved}"
    );

    let resumed = run(python, s, &plan, &["--resume"]);
    assert_eq!(resumed.code, Some(0), "{}", resumed.stderr);
    let record = resumed.stage("train");
    assert_eq!(record["status"], "succeeded");
    assert_eq!(record["attempts"], 2);
    assert_eq!(resumed.metric("train", "resumed_from_step"), saved as f64);
    assert_eq!(resumed.metric("train", "global_step"), steps as f64);
    // The second attempt's progress continued past the saved step: it did not start over.
    let after = events(&run_dir, "train");
    let second: Vec<u64> = after[before.len()..]
        .iter()
        .filter(|e| e["event"] == "progress")
        .filter_map(|e| e["step"].as_u64())
        .collect();
    assert!(
        !second.is_empty() && second.iter().all(|&step| step > saved),
        "saved {saved}, then {second:?}"
    );
    (resumed, saved)
}

#[test]
fn hf_trainer_stopped_by_sigterm_saves_a_checkpoint_that_resume_continues_from() {
    let Some(python) = framework_python() else {
        return;
    };
    let s = Scratch::new("fw-hf-stop");
    // No periodic saves: the only checkpoint is the one the stop asked for.
    let (resumed, saved) = stop_and_resume(
        &python,
        &s,
        "examples/hf-trainer/train.py",
        ", \"--save-steps\", \"1000\"",
        150,
        "model.safetensors",
    );
    let output = resumed.run_dir.join("stages/train/output");
    assert!(output
        .join(format!("checkpoint-{saved}/trainer_state.json"))
        .is_file());
}

#[test]
fn lightning_stopped_by_sigterm_saves_a_checkpoint_that_resume_continues_from() {
    let Some(python) = framework_python() else {
        return;
    };
    let s = Scratch::new("fw-lightning-stop");
    let (resumed, _) = stop_and_resume(
        &python,
        &s,
        "examples/lightning/train.py",
        "",
        200,
        "model.ckpt",
    );
    assert!(resumed
        .run_dir
        .join("stages/train/output/interrupted.ckpt")
        .is_file());
}
