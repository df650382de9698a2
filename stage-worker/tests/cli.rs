//! Drives the real `stage-worker` binary on tiny CPU stages: the event stream, exit codes,
//! checkpoint verification, and SIGTERM → checkpoint → resume.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_stage-worker");

/// A test's own empty directory (under `target/e2e-scratch`), removed unless the test failed.
fn scratch(label: &str) -> e2e_tests::Scratch {
    e2e_tests::Scratch::new(&format!("stage-worker-cli-{label}"))
}

fn write_spec(
    dir: &Path,
    name: &str,
    kind: &str,
    params: Value,
    out: &Path,
    init: Option<&Path>,
) -> PathBuf {
    let spec = json!({
        "v": 1, "stage": name, "kind": kind, "params": params,
        "output_dir": out, "inputs": {}, "init": init, "device": "cpu", "attempt": 1
    });
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
    path
}

fn command(spec: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("--spec")
        .arg(spec)
        .env_remove("ORCHESTRATE_EVENTS")
        .env_remove("ORCHESTRATE_SPEC")
        .env("OMP_NUM_THREADS", "1");
    cmd
}

fn events(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("bad event line {l:?}: {e}"))
        })
        .inspect(|e| assert_eq!(e["v"], 1))
        .collect()
}

fn metrics(events: &[Value]) -> &Value {
    &events
        .iter()
        .find(|e| e["event"] == "metrics")
        .expect("a metrics event")["metrics"]
}

/// Many cheap steps (2 sequences of 16 bytes), for tests that interrupt a run part-way.
fn long_tiny_train(steps: u64) -> Value {
    let mut params = tiny_train("synthetic:pretrain", steps);
    params["progress_every_s"] = json!(0.02);
    params["seq_len"] = json!(16);
    params["batch_size"] = json!(2);
    params
}

fn tiny_train(data: &str, steps: u64) -> Value {
    json!({
        "data": data, "steps": steps, "batch_size": 8, "seq_len": 48, "lr": 1e-2,
        "warmup_steps": 5, "seed": 3, "progress_every_s": 0.05,
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 64}
    })
}

#[test]
fn train_then_eval_then_refuse_a_truncated_checkpoint() {
    let dir = scratch("pipeline");
    let ckpt = dir.join("sft");
    let train = write_spec(
        &dir,
        "sft",
        "train",
        tiny_train("synthetic:sft", 40),
        &ckpt,
        None,
    );
    let out = command(&train).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ev = events(&out);
    assert_eq!(ev.first().unwrap()["event"], "started");
    assert_eq!(ev.last().unwrap()["event"], "done");
    let kinds: Vec<&str> = ev.iter().map(|e| e["event"].as_str().unwrap()).collect();
    let first_ckpt = kinds.iter().position(|k| *k == "checkpoint").unwrap();
    let metrics_at = kinds.iter().position(|k| *k == "metrics").unwrap();
    assert!(first_ckpt < metrics_at, "{kinds:?}");
    let m = metrics(&ev);
    for key in [
        "first_loss",
        "final_loss",
        "tokens_per_s",
        "steps",
        "train_wall_s",
    ] {
        assert!(m[key].is_number(), "missing {key}: {m}");
    }
    assert!(m["final_loss"].as_f64() < m["first_loss"].as_f64());
    for f in [
        "model.safetensors",
        "optimizer.safetensors",
        "manifest.json",
    ] {
        assert!(ckpt.join(f).is_file(), "{f}");
    }

    let eval_params =
        json!({"data": "synthetic:sft", "samples": 24, "batch_size": 8, "seq_len": 48});
    let eval = write_spec(
        &dir,
        "eval",
        "eval",
        eval_params,
        &dir.join("eval"),
        Some(&ckpt),
    );
    let out = command(&eval).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ev = events(&out);
    let m = metrics(&ev);
    let acc = m["accuracy"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&acc));
    let loss = m["loss"].as_f64().unwrap();
    assert!((m["perplexity"].as_f64().unwrap() - loss.exp()).abs() < 1e-6 * loss.exp());
    assert_eq!(m["samples"], 24.0);
    let results: Value =
        serde_json::from_slice(&std::fs::read(dir.join("eval/metrics.json")).unwrap()).unwrap();
    assert_eq!(&results["metrics"], m);
    assert!(dir.join("eval/manifest.json").is_file());

    let model = ckpt.join("model.safetensors");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&model, &bytes[..1000]).unwrap();
    let out = command(&eval).output().unwrap();
    assert_eq!(out.status.code(), Some(65));
    let ev = events(&out);
    let last = ev.last().unwrap();
    assert_eq!(last["event"], "failed");
    assert_eq!(last["reason"], "bad_input");
    let expected = format!(
        "{} is truncated: 1000 of {} bytes",
        model.display(),
        bytes.len()
    );
    assert!(
        last["error"].as_str().unwrap().contains(&expected),
        "{last}"
    );
}

#[test]
fn unusable_specs_exit_65_with_bad_input() {
    let dir = scratch("bad");
    let out_dir = dir.join("out");
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            {
                let p = dir.join("v2.json");
                std::fs::write(&p, r#"{"v":2,"stage":"x"}"#).unwrap();
                p
            },
            "protocol version 2",
        ),
        (
            write_spec(
                &dir,
                "unknown",
                "train",
                json!({"stepz": 3}),
                &out_dir,
                None,
            ),
            "stepz",
        ),
        (
            write_spec(&dir, "noinit", "eval", json!({}), &out_dir, None),
            "has no `init`",
        ),
        (
            write_spec(
                &dir,
                "nofile",
                "train",
                json!({"data": "no/such/file.jsonl"}),
                &out_dir,
                None,
            ),
            "no/such/file.jsonl cannot be read",
        ),
        (dir.join("absent.json"), "cannot read the stage spec"),
    ];
    for (spec, needle) in cases {
        let out = command(&spec).output().unwrap();
        assert_eq!(out.status.code(), Some(65), "{}", spec.display());
        let ev = events(&out);
        let last = ev.last().unwrap();
        assert_eq!(last["event"], "failed");
        assert_eq!(last["reason"], "bad_input");
        assert!(
            last["error"].as_str().unwrap().contains(needle),
            "{needle}: {last}"
        );
    }
}

#[test]
fn sigterm_saves_a_checkpoint_and_a_retry_resumes_it() {
    let dir = scratch("sigterm");
    let out_dir = dir.join("train");
    let params = long_tiny_train(800);
    let spec = write_spec(&dir, "train", "train", params, &out_dir, None);

    let mut child = command(&spec)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let e: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let progress = e["event"] == "progress";
        seen.push(e);
        if progress {
            // SAFETY: signalling our own child by its pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            break;
        }
    }
    seen.extend(lines.map(|l| serde_json::from_str::<Value>(&l.unwrap()).unwrap()));
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(75), "{seen:?}");
    let last = seen.last().unwrap();
    assert_eq!(last["event"], "failed");
    assert_eq!(last["reason"], "interrupted");
    assert!(seen.iter().any(|e| e["event"] == "checkpoint"));
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("manifest.json")).unwrap()).unwrap();
    let stopped_at = manifest["step"].as_u64().unwrap();
    assert!((1..800).contains(&stopped_at), "{manifest}");
    assert_eq!(manifest["model"]["training"]["complete"], false);

    let out = command(&spec).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ev = events(&out);
    let m = metrics(&ev);
    assert_eq!(m["resumed_from_step"].as_f64(), Some(stopped_at as f64));
    assert_eq!(m["steps"], 800.0);
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["step"], 800);
    assert_eq!(manifest["model"]["training"]["complete"], true);

    // The same stage run without interruption reaches the same loss at the final step: the
    // resumed run restored weights, optimizer moments, step, data position and RNG state.
    let straight_dir = dir.join("straight");
    let params = long_tiny_train(800);
    let spec = write_spec(&dir, "straight", "train", params, &straight_dir, None);
    let out = command(&spec).output().unwrap();
    assert!(out.status.success());
    let straight = events(&out);
    let (resumed_loss, straight_loss) = (
        m["final_loss"].as_f64().unwrap(),
        metrics(&straight)["final_loss"].as_f64().unwrap(),
    );
    assert!(
        (resumed_loss - straight_loss).abs() <= 1e-4 * straight_loss.abs().max(1.0),
        "interrupted at step {stopped_at} and resumed: final loss {resumed_loss}; uninterrupted: {straight_loss}"
    );
}

#[test]
fn help_documents_the_contract() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--spec",
        "ORCHESTRATE_SPEC",
        "ORCHESTRATE_EVENTS",
        "EXIT STATUS",
        "75",
        "manifest.json",
    ] {
        assert!(text.contains(needle), "--help lacks {needle}");
    }
}

#[test]
fn periodic_checkpoints_survive_sigkill_and_the_rerun_resumes_from_the_last_one() {
    let dir = scratch("periodic");
    let out_dir = dir.join("train");
    let mut params = long_tiny_train(600);
    params["checkpoint_every"] = json!(50);
    let spec = write_spec(&dir, "train", "train", params, &out_dir, None);
    let mut child = command(&spec)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut last_checkpoint = None;
    for line in lines {
        let e: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if e["event"] == "checkpoint" {
            last_checkpoint = e["step"].as_u64();
            if last_checkpoint >= Some(100) {
                child.kill().unwrap(); // SIGKILL: no chance to save anything more
                break;
            }
        }
    }
    child.wait().unwrap();
    let saved = last_checkpoint.expect("periodic checkpoints were reported");
    assert_eq!(saved % 50, 0);
    let out = command(&spec).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ev = events(&out);
    let resumed = metrics(&ev)["resumed_from_step"].as_f64().unwrap() as u64;
    assert!(
        resumed >= saved && resumed % 50 == 0,
        "resumed at {resumed}, last reported {saved}"
    );
    assert_eq!(metrics(&ev)["steps"], 600.0);
}
