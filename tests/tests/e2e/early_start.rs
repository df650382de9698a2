//! Early starts: a built-in train stage whose upstream released its GPU (and said its outputs
//! are written manifest last) starts while the upstream still persists its checkpoint, waits
//! for the manifest, and reads exactly the upstream's final checkpoint; its finish is
//! recorded only after the upstream's. An upstream that fails after its release has the early
//! stage stopped, uncharged, and started again after the retry. A kill of `orchestrate`
//! anywhere in that window never lets a resume use a partial checkpoint, run a finished stage
//! again, or record the downstream finished first.
//!
//! The stages run on the CPU: `ORCHESTRATE_FAKE_GPUS` gives the run one GPU, and
//! `STAGE_WORKER_SIMULATED_CUDA=<ms>` has the worker release it at the end of its training
//! as on CUDA, its manifest written `<ms>` later (a large checkpoint's disk time). A chain of
//! Llama `train` stages starts early in the same way.

use e2e_tests::succeeded_stages;
use e2e_tests::{alive, wait_for, Scratch};
use e2e_tests::{journal_records, orchestrate, processes_with_env, repo_root, run_plan_with};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The simulated disk time of a checkpoint, after the release: the window an early start
/// overlaps (longer than a forked worker's start-up here, about 0.25 s, so that the
/// downstream stage really waits for the manifest).
const PERSIST_MS: u64 = 500;

/// The tiny training every stage here runs (`init` for the downstream ones).
const TINY: &str = r#"[stage.params]
steps = 3
batch_size = 2
seq_len = 16
model = { d_model = 32, n_layers = 1, n_heads = 2, max_seq_len = 32 }
"#;

/// `orchestrate` on one fake GPU (holders in the scratch's `holders`), with the worker's
/// simulated CUDA device, and `MARK` set for every stage (to find what is left running).
fn command(s: &Scratch) -> Command {
    on_simulated_gpu(Command::new(orchestrate()), s)
}

/// `cmd` (an `orchestrate` command) with what [`command`] sets.
fn on_simulated_gpu(mut cmd: Command, s: &Scratch) -> Command {
    let holders = s.path().join("holders");
    std::fs::create_dir_all(&holders).unwrap();
    cmd.env("ORCHESTRATE_FAKE_GPUS", "1")
        .env("ORCHESTRATE_FAKE_GPU_DIR", &holders)
        .env("STAGE_WORKER_SIMULATED_CUDA", PERSIST_MS.to_string())
        .env("EARLY_START_TEST", s.path());
    cmd
}

/// Whatever is still running with the scratch's mark.
fn left_running(s: &Scratch) -> Vec<i32> {
    processes_with_env(&format!("EARLY_START_TEST={}", s.path().display()))
}

/// A chain a → b of built-in train stages on the GPU.
fn chain_plan(s: &Scratch) -> PathBuf {
    s.write(
        "plan.toml",
        &format!(
            r#"[run]
max_parallel = 2

[[stage]]
name = "a"
kind = "train"
gpus = 1
{TINY}
[[stage]]
name = "b"
kind = "train"
gpus = 1
init = "a"
after = ["a"]
{TINY}"#
        ),
    )
}

/// Where stage `stage`'s records are in the journal: `(rec, attempt, status)` in order.
fn records_of(records: &[serde_json::Value], stage: &str) -> Vec<(String, u64, String)> {
    records
        .iter()
        .filter(|r| r["stage"] == stage)
        .map(|r| {
            (
                r["rec"].as_str().unwrap_or("").to_string(),
                r["attempt"].as_u64().unwrap_or(0),
                r["status"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// The index of the last `stage_finished` record of `stage` with `status`.
fn finished_at(records: &[serde_json::Value], stage: &str, status: &str) -> usize {
    records
        .iter()
        .rposition(|r| r["rec"] == "stage_finished" && r["stage"] == stage && r["status"] == status)
        .unwrap_or_else(|| panic!("no {status} finish of {stage}: {records:?}"))
}

/// The BLAKE3 of `model.safetensors` as listed by the manifest in `dir`.
fn listed_model_checksum(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "model.safetensors")
        .and_then(|f| f["blake3"].as_str())
        .unwrap()
        .to_string()
}

/// The checksum the last attempt of `stage` logged for the `init` weights it loaded.
fn loaded_checksum(run_dir: &Path, stage: &str) -> String {
    let log = std::fs::read_to_string(run_dir.join(format!("stages/{stage}/stderr.log")))
        .unwrap_or_default();
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("initialised from"))
        .unwrap_or_else(|| panic!("{stage} loaded no init checkpoint:\n{log}"));
    let hex = line.rsplit(' ').next().unwrap_or("");
    hex.trim_end_matches(')').to_string()
}

#[test]
fn a_downstream_train_stage_starts_while_its_upstream_persists_and_finishes_after_it() {
    let s = Scratch::new("early-chain");
    let plan = chain_plan(&s);
    let run = run_plan_with(command(&s), &s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let (a, b) = (run.stage("a"), run.stage("b"));
    let (ta, tb) = (&a["timing"], &b["timing"]);
    let t = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
    assert_eq!(b["started_early"], true, "{b}");
    assert!(a.get("started_early").is_none(), "{a}");
    // b was spawned after a's release, before a's process exited (it was still writing).
    assert!(t(tb, "spawned") >= t(ta, "released"), "{ta} {tb}");
    assert!(t(tb, "spawned") < t(ta, "exited"), "{ta} {tb}");
    // b waited for the manifest, which came after its own start-up, and read a's weights file
    // while it waited (the simulated device puts the manifest in place 100 ms after the files).
    assert!(run.metric("b", "input_wait_s") > 0.0, "{b}");
    assert_eq!(run.metric("b", "init_read_early"), 1.0, "{b}");
    // a's finish is recorded before b's.
    let records = journal_records(&run.run_dir);
    assert!(
        finished_at(&records, "a", "succeeded") < finished_at(&records, "b", "succeeded"),
        "{records:?}"
    );
    // b loaded a's final checkpoint: the weights' checksum it verified is the one a's
    // manifest lists and the journal recorded.
    let a_out = run.run_dir.join("stages/a/output");
    let listed = listed_model_checksum(&a_out);
    let recorded = records[finished_at(&records, "a", "succeeded")]["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"].as_str().unwrap().ends_with("model.safetensors"))
        .and_then(|c| c["blake3"].as_str())
        .unwrap()
        .to_string();
    assert_eq!(listed, recorded);
    assert_eq!(loaded_checksum(&run.run_dir, "b"), listed);
    assert!(!run.run_dir.join("stages/b/early-start").exists());
    assert!(left_running(&s).is_empty());

    // Off: b starts only once a is verified.
    let s = Scratch::new("early-chain-off");
    let plan = chain_plan(&s);
    let mut cmd = command(&s);
    cmd.env("ORCHESTRATE_EARLY_START", "0");
    let run = run_plan_with(cmd, &s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let (a, b) = (run.stage("a"), run.stage("b"));
    assert!(b.get("started_early").is_none(), "{b}");
    assert!(t(&b["timing"], "spawned") >= t(&a["timing"], "verified"));
}

/// Stage `up` of the failure test: releases and opts in, and on its first attempt waits for
/// `down` to be up and waiting for the checkpoint, then exits 1 without writing one; on its
/// second, writes `seed`'s checkpoint as its own (the files, then the manifest last).
const UP: &str = r#"
import os, shutil, sys, time
import orchestrate_stage as stage
stage.released(downstream_may_start=True)
out = stage.output_dir()
if os.environ["ORCHESTRATE_ATTEMPT"] == "1":
    log = os.path.join(os.environ["ORCHESTRATE_RUN_DIR"], "stages", "down", "stderr.log")
    deadline = time.time() + 30
    while time.time() < deadline:
        if os.path.exists(log) and "waiting for" in open(log).read():
            break
        time.sleep(0.01)
    sys.exit(1)
src = stage.input_dir("seed")
for name in ("model.safetensors", "optimizer.safetensors", "manifest.json"):
    shutil.copyfile(src / name, out / (name + ".tmp"))
    os.replace(out / (name + ".tmp"), out / name)
"#;

#[test]
fn an_upstream_that_fails_after_its_release_stops_the_early_stage_which_reruns_uncharged() {
    let s = Scratch::new("early-fail");
    let up = s.write("up.py", UP);
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"[run]
max_parallel = 2

[[stage]]
name = "seed"
kind = "train"
{TINY}
[[stage]]
name = "up"
after = ["seed"]
gpus = 1
retries = 1
command = ["python3", "{up}"]
outputs = ["model.safetensors", "manifest.json"]
env = {{ PYTHONPATH = "{path}" }}

[[stage]]
name = "down"
kind = "train"
gpus = 1
retries = 0
init = "up"
after = ["up"]
{TINY}"#,
            up = up.display(),
            path = repo_root().join("python").display(),
        ),
    );
    let run = run_plan_with(command(&s), &s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let records = journal_records(&run.run_dir);
    let down = records_of(&records, "down");
    let expected = [
        ("stage_started", 1, ""),
        ("stage_finished", 1, "cancelled"),
        ("stage_started", 2, ""),
        ("stage_finished", 2, "succeeded"),
    ];
    let got: Vec<(&str, u64, &str)> = down
        .iter()
        .map(|(r, a, st)| (r.as_str(), *a, st.as_str()))
        .collect();
    assert_eq!(got, expected, "{records:?}");
    // Its first attempt was stopped for up's failure, said so, and was not charged: with
    // `retries = 0` it still ran again, after up's retry succeeded.
    let stopped = records
        .iter()
        .find(|r| r["stage"] == "down" && r["status"] == "cancelled")
        .unwrap();
    let error = stopped["error"].as_str().unwrap();
    assert!(
        error.contains("`up`") && error.contains("not counted"),
        "{error}"
    );
    let pos = |rec: &str, stage: &str, attempt: u64| {
        records
            .iter()
            .position(|r| r["rec"] == rec && r["stage"] == stage && r["attempt"] == attempt)
            .unwrap()
    };
    assert!(pos("stage_finished", "up", 1) < pos("stage_finished", "down", 1));
    assert!(pos("stage_finished", "up", 2) < pos("stage_finished", "down", 2));
    assert!(pos("stage_started", "up", 2) < pos("stage_started", "down", 2));
    // Its stopped attempt's processes are gone, and nothing else is left.
    let first_pid = records[pos("stage_started", "down", 1)]["pid"]
        .as_i64()
        .unwrap() as i32;
    assert!(
        wait_for(Duration::from_secs(2), || !alive(first_pid)),
        "down's first attempt still runs"
    );
    assert!(left_running(&s).is_empty());
    let down = run.stage("down");
    assert_eq!(down["status"], "succeeded", "{down}");
    // The rerun read up's final checkpoint (seed's weights, as up wrote them).
    let seed_out = run.run_dir.join("stages/seed/output");
    assert_eq!(
        loaded_checksum(&run.run_dir, "down"),
        listed_model_checksum(&seed_out)
    );
}

/// Starts the chain in the background, its console read here; returns once `a`'s release
/// was announced.
fn start_until_release(s: &Scratch, plan: &Path) -> std::process::Child {
    let mut run = command(s)
        .arg("--plan")
        .arg(plan)
        .arg("--run-dir")
        .arg(s.path().join("run"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = run.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut told = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !told && line.contains("a: released") {
                told = true;
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("a never released its GPU");
    run
}

#[test]
fn a_kill_anywhere_from_the_release_to_the_downstreams_end_never_resumes_wrongly() {
    let instants = 12;
    let (mut in_window, mut ahead) = (0, 0);
    for k in 0..instants {
        let s = Scratch::new(&format!("early-crash-{k}"));
        let plan = chain_plan(&s);
        let mut run = start_until_release(&s, &plan);
        // From the release across a's persistence (PERSIST_MS) and b's whole run.
        std::thread::sleep(Duration::from_millis(100 * k));
        let _ = run.kill();
        let _ = run.wait();
        let run_dir = s.path().join("run");
        let before = journal_records(&run_dir);
        let done_before = succeeded_stages(&before);
        // Never b recorded finished without a.
        assert!(
            !done_before.contains(&"b".to_string()) || done_before.contains(&"a".to_string()),
            "instant {k}: {before:?}"
        );
        if !done_before.contains(&"b".to_string()) {
            in_window += 1;
        }
        // b had been started early (its mark is there) and a was not recorded finished.
        if run_dir.join("stages/b/early-start").exists() && !done_before.contains(&"a".to_string())
        {
            ahead += 1;
        }
        let out = command(&s).arg("resume").arg(&run_dir).output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "instant {k}:\n{text}");
        let after = journal_records(&run_dir);
        let starts = |records: &[serde_json::Value], stage: &str| {
            records
                .iter()
                .filter(|r| r["rec"] == "stage_started" && r["stage"] == stage)
                .count()
        };
        for stage in &done_before {
            assert_eq!(
                starts(&after, stage),
                starts(&before, stage),
                "instant {k}: {stage} was recorded finished, and ran again"
            );
        }
        assert!(
            finished_at(&after, "a", "succeeded") < finished_at(&after, "b", "succeeded"),
            "instant {k}: {after:?}"
        );
        // b's recorded run read a's final checkpoint, whole (its checksum verified).
        let listed = listed_model_checksum(&run_dir.join("stages/a/output"));
        assert_eq!(loaded_checksum(&run_dir, "b"), listed, "instant {k}");
        assert!(
            wait_for(Duration::from_secs(5), || left_running(&s).is_empty()),
            "instant {k}: left running: {:?}",
            left_running(&s)
        );
    }
    assert!(
        in_window >= instants / 2,
        "only {in_window} of {instants} kills came before b's recorded end"
    );
    assert!(
        ahead >= 1,
        "no kill came while b ran ahead of a's recorded end"
    );
}

/// An upstream command stage that opts in to early starts and then succeeds without writing a
/// checkpoint manifest (a broken promise).
const NO_MANIFEST: &str = r#"
import os, time
import orchestrate_stage as stage
stage.released(downstream_may_start=True)
log = os.path.join(os.environ["ORCHESTRATE_RUN_DIR"], "stages", "down", "stderr.log")
deadline = time.time() + 30
while time.time() < deadline:
    if os.path.exists(log) and "waiting for" in open(log).read():
        break
    time.sleep(0.01)
(stage.output_dir() / "model.bin").write_bytes(b"not a checkpoint")
"#;

#[test]
fn an_upstream_that_succeeds_without_its_promised_manifest_does_not_leave_the_early_stage_waiting()
{
    let s = Scratch::new("early-no-manifest");
    let up = s.write("up.py", NO_MANIFEST);
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"[run]
max_parallel = 2

[[stage]]
name = "up"
gpus = 1
command = ["python3", "{up}"]
outputs = ["model.bin"]
env = {{ PYTHONPATH = "{path}" }}

[[stage]]
name = "down"
kind = "train"
gpus = 1
init = "up"
after = ["up"]
{TINY}"#,
            up = up.display(),
            path = repo_root().join("python").display(),
        ),
    );
    let started = std::time::Instant::now();
    let run = run_plan_with(command(&s), &s, &plan, &[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(started.elapsed() < Duration::from_secs(60));
    let records = journal_records(&run.run_dir);
    let got: Vec<(String, u64, String)> = records_of(&records, "down");
    let statuses: Vec<&str> = got
        .iter()
        .filter(|(r, ..)| r == "stage_finished")
        .map(|(_, _, st)| st.as_str())
        .collect();
    // Stopped once up's success showed no manifest; then started the ordinary way, which
    // fails on the missing checkpoint.
    assert_eq!(statuses, vec!["cancelled", "failed"], "{records:?}");
    let stopped = records
        .iter()
        .find(|r| r["stage"] == "down" && r["status"] == "cancelled")
        .unwrap();
    assert!(
        stopped["error"]
            .as_str()
            .unwrap()
            .contains("without the checkpoint manifest"),
        "{stopped}"
    );
    let down = run.stage("down");
    assert_eq!(down["failure"], "bad_input", "{down}");
    assert!(left_running(&s).is_empty());
}

/// Stage `stage`'s worker log.
fn stage_log(run_dir: &Path, stage: &str) -> String {
    std::fs::read_to_string(run_dir.join(format!("stages/{stage}/stderr.log"))).unwrap_or_default()
}

#[test]
fn the_downstream_stage_becomes_the_standby_its_upstream_readied_and_nothing_is_left() {
    let s = Scratch::new("standby-chain");
    let plan = chain_plan(&s);
    let run = run_plan_with(command(&s), &s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // a was forked (no stage finished before it); b was the standby that a's `finishing`
    // event had the fork server start, and it trained from a's checkpoint as usual.
    let (log_a, log_b) = (stage_log(&run.run_dir, "a"), stage_log(&run.run_dir, "b"));
    assert!(log_a.contains("started by the fork server"), "{log_a}");
    assert!(!log_a.contains("from a standby"), "{log_a}");
    assert!(log_b.contains("from a standby"), "{log_b}");
    assert_eq!(run.stage("b")["started_early"], true);
    let listed = listed_model_checksum(&run.run_dir.join("stages/a/output"));
    assert_eq!(loaded_checksum(&run.run_dir, "b"), listed);
    assert!(left_running(&s).is_empty());

    // Off: every stage is forked.
    let s = Scratch::new("standby-off");
    let plan = chain_plan(&s);
    let mut cmd = command(&s);
    cmd.env("ORCHESTRATE_STANDBY", "0");
    let run = run_plan_with(cmd, &s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let log_b = stage_log(&run.run_dir, "b");
    assert!(log_b.contains("started by the fork server"), "{log_b}");
    assert!(!log_b.contains("from a standby"), "{log_b}");
}

#[test]
fn a_standby_no_stage_can_become_is_killed_and_the_next_stage_is_forked_as_usual() {
    // b sets a variable the CUDA driver reads at start-up, so the standby readied under a's
    // environment must not serve it.
    let s = Scratch::new("standby-mismatch");
    let text = std::fs::read_to_string(chain_plan(&s)).unwrap();
    let text = text.replace(
        "init = \"a\"\n",
        "init = \"a\"\nenv = { CUDA_MODULE_LOADING = \"EAGER\" }\n",
    );
    let plan = s.write("plan.toml", &text);
    let mut cmd = command(&s);
    cmd.env("RUST_LOG", "orchestrator=debug,warn");
    let run = run_plan_with(cmd, &s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("standby started"), "{}", run.stderr);
    let log_b = stage_log(&run.run_dir, "b");
    assert!(log_b.contains("started by the fork server"), "{log_b}");
    assert!(!log_b.contains("from a standby"), "{log_b}");
    // The standby that waited in vain is gone with the run: killed by `orchestrate` as it shut
    // its servers down (not merely by its death signal once `orchestrate` exited).
    assert!(run.stderr.contains("standby killed"), "{}", run.stderr);
    assert!(left_running(&s).is_empty());
}

/// A chain of Llama `train` stages hands on as the byte-level chain does: the upstream (a
/// Llama made by transformers in a command stage before it) releases its GPU once its
/// streamed checkpoint is on the host, the downstream starts then, waits for the manifest and
/// reads the final checkpoint, and its finish is recorded after the upstream's.
#[test]
fn a_llama_train_stage_downstream_of_another_starts_early_as_the_byte_level_one_does() {
    let Some(python) = e2e_tests::framework_python() else {
        return;
    };
    let s = Scratch::new("early-llama");
    let mut text = String::new();
    for i in 0..200 {
        let words = ["cat", "dog", "red", "fox", "runs", "sees", "small", "green"];
        let phrase: Vec<&str> = (0..3).map(|j| words[(i * 7 + j * 5) % 8]).collect();
        let line = serde_json::json!({"text": format!("the {} and more.", phrase.join(" "))});
        text.push_str(&format!("{line}\n"));
    }
    let data = s.write("text.jsonl", &text);
    let make = repo_root().join("configs/llama/make_tiny_llama.py");
    let params = format!(
        "[stage.params]\ndata = \"{}\"\nsteps = 3\nbatch_size = 2\nseq_len = 16\n",
        data.display()
    );
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"[run]
max_parallel = 2

[[stage]]
name = "base"
command = ["python3", "{make}", "--out", "{{output}}", "--corpus", "{data}", "--vocab", "300"]
outputs = ["config.json", "model.safetensors"]

[[stage]]
name = "a"
kind = "train"
gpus = 1
init = "base"
after = ["base"]
{params}
[[stage]]
name = "b"
kind = "train"
gpus = 1
init = "a"
after = ["a"]
{params}"#,
            make = make.display(),
            data = data.display(),
        ),
    );
    let cmd = on_simulated_gpu(e2e_tests::orchestrate_with(&python), &s);
    let run = run_plan_with(cmd, &s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let (a, b) = (run.stage("a"), run.stage("b"));
    let (ta, tb) = (&a["timing"], &b["timing"]);
    let t = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
    assert_eq!(b["started_early"], true, "{b}");
    assert!(t(tb, "spawned") >= t(ta, "released"), "{ta} {tb}");
    assert!(t(tb, "spawned") < t(ta, "exited"), "{ta} {tb}");
    assert!(
        run.metric("a", "t_device_released") < run.metric("a", "t_checkpoint_durable"),
        "{a}"
    );
    assert!(run.metric("b", "input_wait_s") > 0.0, "{b}");
    let records = journal_records(&run.run_dir);
    assert!(
        finished_at(&records, "a", "succeeded") < finished_at(&records, "b", "succeeded"),
        "{records:?}"
    );
    // b's output is a Hugging Face directory again, and nothing is left running.
    let b_out = run.run_dir.join("stages/b/output");
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(b_out.join(file).is_file(), "{file}");
    }
    assert!(left_running(&s).is_empty());
}
