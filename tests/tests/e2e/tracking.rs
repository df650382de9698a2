//! Experiment tracking against a real MLflow server: a run with `tracking = "mlflow"` is one
//! MLflow run with a nested run per stage, whose params, metrics (with their steps) and tags
//! are read back through MLflow's own client; `orchestrate track` logs a run made without it.

use e2e_tests::mlflow::{mlflow, MlflowServer};
use e2e_tests::{orchestrate, run_plan, run_plan_with, Scratch};
use serde_json::Value;

/// MLflow's client, reading every run of `experiment`: each run's name, parent, status,
/// params, tags, and every metric's history (key → [[step, value], …]).
const READ_BACK: &str = r#"
import sys
client = mlflow.MlflowClient(URI)
exp = client.get_experiment_by_name(EXPERIMENT)
out = []
for run in client.search_runs([exp.experiment_id]):
    history = {}
    for key in run.data.metrics:
        history[key] = [[m.step, m.value] for m in client.get_metric_history(run.info.run_id, key)]
    out.append({
        "name": run.info.run_name, "id": run.info.run_id, "status": run.info.status,
        "parent": run.data.tags.get("mlflow.parentRunId"),
        "params": run.data.params, "tags": run.data.tags, "history": history,
    })
print(json.dumps(out))
"#;

fn read_back(server: &MlflowServer, experiment: &str) -> Vec<Value> {
    let script = format!("EXPERIMENT = {experiment:?}\n{READ_BACK}");
    server.read_back(&script).as_array().unwrap().clone()
}

/// A built-in train stage, an eval from its checkpoint, and a command stage that fails.
const PLAN: &str = r#"
[run]
name = "tracked"
tracking = "mlflow"
experiment = "EXPERIMENT"

[[stage]]
name = "train"
kind = "train"
[stage.params]
steps = 6
batch_size = 2
seq_len = 16
progress_every_s = 0.001
model = { d_model = 32, n_layers = 1, n_heads = 2, max_seq_len = 32 }

[[stage]]
name = "eval"
kind = "eval"
after = ["train"]
init = "train"
[stage.params]
seq_len = 16
samples = 4

[[stage]]
name = "broken"
command = ["sh", "-c", "exit 3"]
"#;

#[test]
fn a_tracked_run_is_an_mlflow_run_with_a_nested_run_per_stage_read_back_by_mlflows_client() {
    let Some(mlflow) = mlflow() else { return };
    let s = Scratch::new("tracking");
    let server = MlflowServer::start(&mlflow, s.path());
    let plan = s.write("plan.toml", &PLAN.replace("EXPERIMENT", "e2e-tracked"));
    let mut cmd = std::process::Command::new(orchestrate());
    cmd.env("MLFLOW_TRACKING_URI", &server.uri);
    let run = run_plan_with(cmd, &s, &plan, &[]);
    assert_eq!(
        run.code,
        Some(1),
        "the broken stage fails the run: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains("tracking: MLflow run"),
        "{}",
        run.stderr
    );
    let runs = read_back(&server, "e2e-tracked");
    let by_name = |name: &str| {
        runs.iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no MLflow run {name}: {runs:?}"))
    };
    let dir_name = run.run_dir.file_name().unwrap().to_str().unwrap();
    let parent = by_name(dir_name);
    assert_eq!(parent["status"], "FAILED");
    assert_eq!(parent["tags"]["orchestrate.status"], "failed");
    assert_eq!(
        parent["tags"]["orchestrate.run_dir"],
        std::fs::canonicalize(&run.run_dir)
            .unwrap()
            .to_str()
            .unwrap()
    );
    for stage in ["train", "eval", "broken"] {
        assert_eq!(by_name(stage)["parent"], parent["id"], "{stage} is nested");
    }

    // The train stage: its params, its loss at every step it reported, its final metrics, and
    // what orchestrate verified.
    let train = by_name("train");
    assert_eq!(train["status"], "FINISHED");
    assert_eq!(train["params"]["kind"], "train");
    assert_eq!(train["params"]["steps"], "6");
    assert_eq!(train["params"]["model.d_model"], "32");
    let loss: Vec<i64> = train["history"]["loss"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_i64().unwrap())
        .collect();
    assert!(
        loss.len() >= 2 && loss.windows(2).all(|w| w[0] < w[1]),
        "loss at its steps: {loss:?}"
    );
    assert_eq!(
        train["history"]["final_loss"][0][1].as_f64(),
        Some(run.metric("train", "final_loss"))
    );
    assert!(
        train["history"].get("t_model_ready").is_none(),
        "no internal timings"
    );
    assert_eq!(train["tags"]["orchestrate.status"], "succeeded");
    let checksums: Vec<&str> = train["tags"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("orchestrate.checkpoint."))
        .map(|(_, v)| v.as_str().unwrap())
        .collect();
    let recorded = run.stage("train")["checkpoints"].as_array().unwrap().len();
    assert!(recorded > 0 && checksums.len() == recorded, "{checksums:?}");
    assert!(checksums
        .iter()
        .all(|c| c.starts_with("blake3 ") || c.starts_with("sha256 ")));

    let eval = by_name("eval");
    assert_eq!(eval["params"]["init"], "train");
    assert_eq!(
        eval["history"]["accuracy"][0][1].as_f64(),
        Some(run.metric("eval", "accuracy"))
    );
    let broken = by_name("broken");
    assert_eq!(broken["status"], "FAILED");
    assert_eq!(broken["tags"]["orchestrate.failure"], "exit_code");
}

#[test]
fn track_logs_a_run_made_without_tracking_and_a_dead_server_only_warns() {
    let Some(mlflow) = mlflow() else { return };
    let s = Scratch::new("tracking-later");
    let plan = s.write(
        "plan.toml",
        "[run]\ntracking = \"mlflow\"\ntracking_uri = \"http://127.0.0.1:9\"\n[[stage]]\nname = \"one\"\ncommand = [\"true\"]\n",
    );
    // Nothing listens on port 9: the run succeeds all the same, with a warning that says how
    // to log it later.
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("orchestrate track"), "{}", run.stderr);

    let server = MlflowServer::start(&mlflow, s.path());
    let out = std::process::Command::new(orchestrate())
        .arg("track")
        .arg(&run.run_dir)
        .args(["--uri", &server.uri, "--experiment", "later"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runs = read_back(&server, "later");
    assert_eq!(runs.len(), 2, "the run and its stage: {runs:?}");
    let one = runs.iter().find(|r| r["name"] == "one").unwrap();
    assert_eq!(one["status"], "FINISHED");
    assert_eq!(one["params"]["command"], "true");
}
