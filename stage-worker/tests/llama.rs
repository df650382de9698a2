//! Llama-architecture models against the real transformers, on the CPU in fp32: a checkpoint
//! transformers made (random init, `save_pretrained`) gives the worker transformers' logits; a
//! Llama the worker trained loads with `AutoModelForCausalLM.from_pretrained` and gives the
//! worker's logits; an SFT stage starts from that output and an eval stage scores it.
//!
//! The Python is `ORCHESTRATE_TEST_PYTHON` (torch, transformers, tokenizers); under CI
//! (`CI=true`) a missing one fails these tests, elsewhere `.venv-frameworks/` is tried and
//! the tests are skipped without it.

use e2e_tests::{framework_python, repo_root, Scratch};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_stage-worker");
/// Token ids the logits are compared on (two rows; every id below the tiny vocabulary).
const IDS: &str = "1,40,7,99,250,3,17,64,5,200;1,2,3,4,5,6,7,8,9,10";

fn ok(out: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn python(py: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(py);
    cmd.args(args)
        .env("OMP_NUM_THREADS", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONWARNINGS", "ignore")
        .env("HF_HUB_OFFLINE", "1");
    cmd
}

/// A tiny Llama made by transformers in `dir` (weights drawn with a large std, so the logits
/// are far from zero and a wrong computation shows), its tokenizer trained on `corpus`.
fn make_tiny(py: &Path, dir: &Path, corpus: &Path, extra: &[&str]) {
    let script = repo_root().join("configs/llama/make_tiny_llama.py");
    let mut args = vec![
        script.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--corpus",
        corpus.to_str().unwrap(),
        "--hidden",
        "64",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--vocab",
        "300",
        "--rope-theta",
        "500",
        "--init-std",
        "0.1",
    ];
    args.extend(extra);
    ok(&python(py, &args).output().unwrap(), "make_tiny_llama.py");
}

/// Asserts that the worker's logits for the model in `dir` are transformers' within 1e-3.
fn assert_same_logits(py: &Path, dir: &Path, s: &Scratch) -> Value {
    let out_file = s.join(format!(
        "logits-{}.safetensors",
        dir.file_name().unwrap().to_str().unwrap()
    ));
    let worker = Command::new(BIN)
        .args(["llama-logits", "--model"])
        .arg(dir)
        .args(["--ids", IDS, "--out"])
        .arg(&out_file)
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap();
    ok(&worker, "stage-worker llama-logits");
    let check = repo_root().join("stage-worker/tests/llama_check.py");
    let out = python(
        py,
        &[
            check.to_str().unwrap(),
            "compare",
            dir.to_str().unwrap(),
            IDS,
            out_file.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or("null"))
        .unwrap_or_else(|_| {
            panic!(
                "llama_check.py: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(
        out.status.success(),
        "the worker's logits differ from transformers': {report}"
    );
    assert!(report["max_abs_diff"].as_f64().unwrap() <= 1e-3, "{report}");
    assert!(
        report["max_abs_logit"].as_f64().unwrap() > 0.5,
        "the logits are large enough for the comparison to mean something: {report}"
    );
    report
}

/// Text documents and prompt/completion pairs of a tiny upper-casing task.
fn write_data(s: &Scratch) -> (PathBuf, PathBuf) {
    let words = [
        "cat", "dog", "red", "fox", "runs", "sees", "small", "green", "bird",
    ];
    let (mut text, mut pairs) = (String::new(), String::new());
    for i in 0..200usize {
        let n = 2 + i % 4;
        let phrase: Vec<&str> = (0..n)
            .map(|j| words[(i * 7 + j * 5) % words.len()])
            .collect();
        let phrase = phrase.join(" ");
        text.push_str(&json!({"text": format!("the {phrase} and the {phrase}.")}).to_string());
        text.push('\n');
        pairs.push_str(
            &json!({"prompt": format!("upper: {phrase}\n"), "completion": format!("{}\n", phrase.to_uppercase())})
                .to_string(),
        );
        pairs.push('\n');
    }
    (
        s.write("pretrain.jsonl", &text),
        s.write("sft.jsonl", &pairs),
    )
}

/// Runs one stage of `kind` on the CPU; returns its events.
fn stage(
    s: &Scratch,
    name: &str,
    kind: &str,
    params: Value,
    init: &Path,
    out: &Path,
) -> Vec<Value> {
    let spec = json!({
        "v": 1, "stage": name, "kind": kind, "params": params,
        "output_dir": out, "inputs": {}, "init": init, "device": "cpu", "attempt": 1
    });
    let path = s.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
    let out = worker(&path).output().unwrap();
    ok(&out, name)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

/// The worker on the spec at `spec`, its events on stdout, one CPU thread.
fn worker(spec: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("--spec")
        .arg(spec)
        .env_remove("ORCHESTRATE_EVENTS")
        .env("OMP_NUM_THREADS", "1");
    cmd
}

fn metrics(events: &[Value]) -> &Value {
    &events
        .iter()
        .find(|e| e["event"] == "metrics")
        .unwrap_or_else(|| panic!("no metrics in {events:?}"))["metrics"]
}

#[test]
fn a_checkpoint_transformers_made_gives_the_worker_transformers_logits() {
    let Some(py) = framework_python() else { return };
    let s = Scratch::new("llama-hf-in");
    let (text, _) = write_data(&s);
    for (name, extra) in [("untied", &[][..]), ("tied", &["--tied"][..])] {
        let dir = s.join(name);
        make_tiny(&py, &dir, &text, extra);
        let config: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["tie_word_embeddings"], name == "tied");
        assert_same_logits(&py, &dir, &s);
    }
}

#[test]
fn a_llama_the_worker_trained_loads_in_transformers_then_sft_and_eval_follow() {
    let Some(py) = framework_python() else { return };
    let s = Scratch::new("llama-train");
    let (text, pairs) = write_data(&s);
    let base = s.join("base");
    make_tiny(&py, &base, &text, &[]);
    let pretrain = s.join("pretrain");
    let params = json!({"data": text, "steps": 30, "batch_size": 8, "seq_len": 32, "lr": 1e-2,
                        "warmup_steps": 3, "seed": 1, "progress_every_s": 0.05});
    let events = stage(&s, "pretrain", "train", params, &base, &pretrain);
    assert_eq!(events[0]["event"], "started", "{events:?}");
    let m = metrics(&events);
    let (first, last) = (
        m["first_loss"].as_f64().unwrap(),
        m["final_loss"].as_f64().unwrap(),
    );
    assert!(last < first - 1.0, "pretraining learned: {first} -> {last}");
    assert_eq!(m["steps"], 30.0);
    for file in [
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "manifest.json",
    ] {
        assert!(pretrain.join(file).is_file(), "{file} in the output");
        assert!(
            file == "manifest.json"
                || events.iter().any(|e| e["event"] == "checkpoint"
                    && e["path"].as_str().is_some_and(|p| p.ends_with(file))),
            "{file} reported as a checkpoint file"
        );
    }
    assert_ne!(
        std::fs::read(base.join("model.safetensors")).unwrap(),
        std::fs::read(pretrain.join("model.safetensors")).unwrap()
    );
    // What the worker trained, transformers loads, and computes as the worker does.
    assert_same_logits(&py, &pretrain, &s);

    // SFT from that output, the prompt masked; then an eval stage of the SFT model.
    let sft = s.join("sft");
    let params = json!({"data": pairs, "steps": 40, "batch_size": 16, "seq_len": 32, "lr": 1e-2,
                        "warmup_steps": 3, "seed": 2});
    let m = metrics(&stage(&s, "sft", "train", params, &pretrain, &sft)).clone();
    let (first, last) = (
        m["first_loss"].as_f64().unwrap(),
        m["final_loss"].as_f64().unwrap(),
    );
    assert!(
        last < first / 2.0,
        "SFT learned the completions: {first} -> {last}"
    );
    assert_same_logits(&py, &sft, &s);
    let eval_dir = s.join("eval");
    let params = json!({"data": pairs, "samples": 50, "batch_size": 25, "seq_len": 32});
    let em = metrics(&stage(&s, "eval", "eval", params.clone(), &sft, &eval_dir)).clone();
    assert_eq!(em["samples"], 50.0);
    let loss = em["loss"].as_f64().unwrap();
    assert!(
        loss.is_finite() && loss < first,
        "eval loss {loss} (SFT began at {first})"
    );
    assert!(em["accuracy"].as_f64().is_some(), "{em}");
    let results: Value =
        serde_json::from_slice(&std::fs::read(eval_dir.join("metrics.json")).unwrap()).unwrap();
    assert_eq!(results["metrics"]["loss"], em["loss"]);
    assert_eq!(results["checkpoint_step"], 40, "{results}");

    // The eval checks the weights against their manifest too: one flipped byte (same size)
    // and it fails, writing no results.
    let weights = sft.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&weights, bytes).unwrap();
    let spec = json!({
        "v": 1, "stage": "eval-corrupt", "kind": "eval", "params": params,
        "output_dir": s.join("eval-corrupt"), "inputs": {}, "init": sft, "device": "cpu", "attempt": 1
    });
    let path = s.join("eval-corrupt.json");
    std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
    let out = worker(&path).output().unwrap();
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("is corrupted"), "{stdout}");
    assert!(!s.join("eval-corrupt/metrics.json").exists());
}

#[test]
fn a_stopped_llama_training_resumes_to_the_loss_of_an_uninterrupted_one() {
    use std::io::{BufRead, BufReader};
    let Some(py) = framework_python() else { return };
    let s = Scratch::new("llama-resume");
    let (text, _) = write_data(&s);
    let base = s.join("base");
    make_tiny(&py, &base, &text, &["--tied"]);
    let params = json!({"data": text, "steps": 300, "batch_size": 2, "seq_len": 16, "lr": 1e-2,
                        "warmup_steps": 3, "seed": 3, "progress_every_s": 0.01});
    let out_dir = s.join("stopped");
    let spec = json!({
        "v": 1, "stage": "stopped", "kind": "train", "params": params,
        "output_dir": out_dir, "inputs": {}, "init": base, "device": "cpu", "attempt": 1
    });
    let spec_path = s.join("stopped.json");
    std::fs::write(&spec_path, serde_json::to_vec(&spec).unwrap()).unwrap();
    let command = || {
        let mut c = Command::new(BIN);
        c.arg("--spec")
            .arg(&spec_path)
            .env_remove("ORCHESTRATE_EVENTS")
            .env("OMP_NUM_THREADS", "1");
        c
    };
    let mut child = command()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let e: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if e["event"] == "progress" && !seen.iter().any(|x: &Value| x["event"] == "progress") {
            // SAFETY: signalling our own child by its pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        seen.push(e);
    }
    assert_eq!(child.wait().unwrap().code(), Some(75), "{seen:?}");
    assert_eq!(seen.last().unwrap()["reason"], "interrupted");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("manifest.json")).unwrap()).unwrap();
    let stopped_at = manifest["step"].as_u64().unwrap();
    assert!((1..300).contains(&stopped_at), "{manifest}");
    assert_eq!(manifest["model"]["training"]["complete"], false);

    let out = command().output().unwrap();
    let events: Vec<Value> = ok(&out, "the resumed training")
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let resumed = metrics(&events).clone();
    assert_eq!(
        resumed["resumed_from_step"].as_f64(),
        Some(stopped_at as f64)
    );
    let straight_params = spec["params"].clone();
    let straight = metrics(&stage(
        &s,
        "straight",
        "train",
        straight_params,
        &base,
        &s.join("straight"),
    ))
    .clone();
    let (a, b) = (
        resumed["final_loss"].as_f64().unwrap(),
        straight["final_loss"].as_f64().unwrap(),
    );
    assert!(
        (a - b).abs() <= 1e-4 * b.abs().max(1.0),
        "resumed at {stopped_at}: {a}; straight: {b}"
    );
    assert_eq!(resumed["first_loss"], straight["first_loss"]);

    // Run again once complete: the finished training is reported, not retrained.
    let out = command().output().unwrap();
    let again: Vec<Value> = ok(&out, "the run after completion")
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(!again.iter().any(|e| e["event"] == "progress"), "{again:?}");
    assert_eq!(metrics(&again)["final_loss"], resumed["final_loss"]);
}

/// `STAGE_WORKER_PROFILE` traces the steps it names of a Llama training too: the trace holds
/// the Llama block's operators (RMSNorm, attention) and the stage still succeeds.
#[test]
fn a_profiled_llama_training_saves_a_trace_of_its_steps() {
    let Some(py) = framework_python() else { return };
    let s = Scratch::new("llama-profile");
    let (text, _) = write_data(&s);
    let base = s.join("base");
    make_tiny(&py, &base, &text, &[]);
    let params = json!({"data": text, "steps": 4, "batch_size": 2, "seq_len": 16, "lr": 1e-3,
                        "warmup_steps": 1, "seed": 1});
    let spec = json!({
        "v": 1, "stage": "profiled", "kind": "train", "params": params,
        "output_dir": s.join("out"), "inputs": {}, "init": base, "device": "cpu", "attempt": 1
    });
    let spec_path = s.join("profiled.json");
    std::fs::write(&spec_path, serde_json::to_vec(&spec).unwrap()).unwrap();
    let trace = s.join("trace.json");
    let out = Command::new(BIN)
        .arg("--spec")
        .arg(&spec_path)
        .env_remove("ORCHESTRATE_EVENTS")
        .env("OMP_NUM_THREADS", "1")
        .env("STAGE_WORKER_PROFILE", &trace)
        .env("STAGE_WORKER_PROFILE_SKIP", "1")
        .env("STAGE_WORKER_PROFILE_STEPS", "2")
        .output()
        .unwrap();
    ok(&out, "the profiled training");
    let trace: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let names: Vec<&str> = trace["traceEvents"]
        .as_array()
        .expect("a Chrome trace")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    for op in ["aten::rms_norm", "aten::scaled_dot_product_attention"] {
        assert!(names.contains(&op), "{op} missing from the trace");
    }
}

/// The simulated disk time of the upstream's checkpoint after its release (the window in
/// which the downstream stage starts and waits; well beyond a worker's start-up).
const PERSIST_MS: u64 = 3000;

/// A Llama `train` stage on a device it gives back early (`STAGE_WORKER_SIMULATED_CUDA`: the
/// release once the checkpoint's data is on the host, as on CUDA, the manifest `PERSIST_MS`
/// later) streams its checkpoint and releases the device before the checkpoint is durable,
/// with the byte-level model's events and milestones; a stage started at that release, its
/// `init` still being written, runs as a Llama stage, waits for the manifest and trains from
/// the upstream's final weights, which it checks against the manifest.
#[test]
fn a_llama_stage_releases_its_device_before_its_streamed_checkpoint_is_durable_and_the_next_starts_early(
) {
    use std::io::{BufRead, BufReader};
    let Some(py) = framework_python() else { return };
    let s = Scratch::new("llama-release");
    let (text, pairs) = write_data(&s);
    let base = s.join("base");
    make_tiny(&py, &base, &text, &[]);
    let up = s.join("up");
    let params = json!({"data": text, "steps": 10, "batch_size": 4, "seq_len": 16, "lr": 1e-2,
                        "warmup_steps": 2, "seed": 1});
    let spec = json!({
        "v": 1, "stage": "up", "kind": "train", "params": params,
        "output_dir": up, "inputs": {}, "init": base, "device": "cuda", "attempt": 1
    });
    let spec_path = s.join("up.json");
    std::fs::write(&spec_path, serde_json::to_vec(&spec).unwrap()).unwrap();
    let mut upstream = worker(&spec_path)
        .env("STAGE_WORKER_SIMULATED_CUDA", PERSIST_MS.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let down_params = json!({"data": pairs, "steps": 3, "batch_size": 4, "seq_len": 32,
                             "lr": 1e-2, "warmup_steps": 1, "seed": 2});
    let down_spec = json!({
        "v": 1, "stage": "down", "kind": "train", "params": down_params,
        "output_dir": s.join("down"), "inputs": {}, "init": up, "device": "cpu", "attempt": 1,
        "inputs_being_written": [up], "input_wait_limit_s": 120
    });
    let down_path = s.join("down.json");
    std::fs::write(&down_path, serde_json::to_vec(&down_spec).unwrap()).unwrap();
    let (mut events, mut downstream, mut at_release) = (Vec::new(), None, None);
    for line in BufReader::new(upstream.stdout.take().unwrap()).lines() {
        let e: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if e["event"] == "released" && downstream.is_none() {
            // What a stage started now finds in the upstream's output directory.
            at_release = Some((
                up.join("config.json").is_file(),
                up.join("manifest.json").exists(),
            ));
            let child = worker(&down_path)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            downstream = Some(child);
        }
        events.push(e);
    }
    assert!(upstream.wait().unwrap().success(), "{events:?}");
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    let at = |k: &str| kinds.iter().position(|x| *x == k).unwrap_or(usize::MAX);
    // `finishing` after the last step, the release before any file is reported durable.
    assert!(
        at("finishing") < at("released") && at("released") < at("checkpoint"),
        "{kinds:?}"
    );
    assert_eq!(events[at("released")]["downstream_may_start"], true);
    assert_eq!(
        at_release,
        Some((true, false)),
        "at the release config.json is in place and the manifest is not yet"
    );
    let m = metrics(&events);
    let t = |k: &str| m[k].as_f64().unwrap_or_else(|| panic!("no {k} in {m}"));
    assert!(t("t_device_released") < t("t_checkpoint_durable"), "{m}");
    assert!(t("t_last_step") <= t("t_device_released"), "{m}");
    assert!(t("checkpoint_write_s") > 0.0, "{m}");
    // Streamed: each tensor file's phases, as the byte-level model reports them.
    for k in ["t_copied_model", "t_hashed_model", "t_synced_optimizer"] {
        t(k);
    }
    // The manifest (written last) lists every file the stage reported, as written.
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(up.join("manifest.json")).unwrap()).unwrap();
    let listed: Vec<&str> = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    for file in [
        "model.safetensors",
        "optimizer.safetensors",
        "config.json",
        "tokenizer.json",
    ] {
        assert!(listed.contains(&file), "{file} not in {listed:?}");
    }

    // The downstream stage waited for the manifest and trained from the final weights: its
    // first loss is that of the same stage started after the upstream had finished.
    let down = downstream
        .expect("the upstream released its device")
        .wait_with_output()
        .unwrap();
    let down_events: Vec<Value> = ok(&down, "the stage started early")
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let early = metrics(&down_events).clone();
    assert!(early["input_wait_s"].as_f64().unwrap() > 0.0, "{early}");
    let log = String::from_utf8_lossy(&down.stderr);
    assert!(log.contains("Llama model"), "{log}");
    assert_eq!(early["init_read_early"], 1.0, "{early}");
    let after = metrics(&stage(
        &s,
        "down-after",
        "train",
        down_params.clone(),
        &up,
        &s.join("after"),
    ))
    .clone();
    assert_eq!(early["first_loss"], after["first_loss"]);

    // The weights are checked against the manifest, as the byte-level model's are: one
    // flipped byte (same size) and a stage from that checkpoint fails, writing no model.
    let weights = up.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&weights, bytes).unwrap();
    let spec = json!({
        "v": 1, "stage": "corrupt", "kind": "train", "params": down_params,
        "output_dir": s.join("corrupt"), "inputs": {}, "init": up, "device": "cpu", "attempt": 1
    });
    let path = s.join("corrupt.json");
    std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
    let out = worker(&path).output().unwrap();
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("is corrupted"), "{stdout}");
    assert!(!s.join("corrupt/model.safetensors").exists());
}
