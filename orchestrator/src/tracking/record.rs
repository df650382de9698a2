//! What a stage puts in its tracker run, from what the run directory holds: the stage's
//! params (its plan entry and matrix values), its metrics with their steps (every progress
//! event in `events.jsonl`, then the final metrics), and tags for what orchestrate verified
//! (status, attempts, failure, each GPU's verdict and reclaim time, checkpoint checksums).

use super::mlflow::Metric;
use crate::plan::matrix::Instance;
use protocol::plan::Stage;
use protocol::report::StageReport;

/// MLflow keeps a param's value up to this many characters.
const PARAM_VALUE: usize = 6000;
/// And a tag's.
const TAG_VALUE: usize = 8000;

/// The stage's params: `kind` or `command`, `init`, `gpus`, every built-in param (nested
/// tables as dotted keys: `model.d_model`), and each matrix value as `matrix.KEY`.
pub fn params(stage: &Stage, instance: Option<&Instance>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(kind) = &stage.kind {
        out.push((
            "kind".to_string(),
            serde_json::to_value(kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
        ));
    }
    if let Some(command) = &stage.command {
        out.push(("command".to_string(), command.join(" ")));
    }
    if let Some(init) = &stage.init {
        out.push(("init".to_string(), init.clone()));
    }
    if let Some(gpus) = stage.gpus {
        out.push(("gpus".to_string(), gpus.to_string()));
    }
    for (key, value) in &stage.params {
        flatten(key, value, &mut out);
    }
    for (key, value) in instance.map(|i| i.values.as_slice()).unwrap_or_default() {
        out.push((format!("matrix.{key}"), value.clone()));
    }
    for (_, value) in &mut out {
        cut(value, PARAM_VALUE);
    }
    out
}

/// `value` under `key`: a table's entries as `key.sub`, anything else as its text.
fn flatten(key: &str, value: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match value {
        serde_json::Value::Object(map) => {
            for (sub, v) in map {
                flatten(&format!("{key}.{sub}"), v, out);
            }
        }
        serde_json::Value::String(s) => out.push((key.to_string(), s.clone())),
        other => out.push((key.to_string(), other.to_string())),
    }
}

/// Every number of every `progress` event the stage sent (`events.jsonl`, one JSON object a
/// line: `{"t": unix_ms, "event": {"event": "progress", "step": N, "loss": …}}`) as a metric
/// at that step, then `final_metrics` at the last step seen. `step` and `total_steps` are the
/// axis, not metrics; the worker's `t_*` timings are left out.
pub fn metrics(events_jsonl: &str, final_metrics: &StageReport, end_ms: i64) -> Vec<Metric> {
    let mut out = Vec::new();
    let mut last_step = 0i64;
    for line in events_jsonl.lines() {
        let Ok(record) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let event = &record["event"];
        if event["event"] != "progress" {
            continue;
        }
        let Some(step) = event["step"].as_i64() else {
            continue;
        };
        last_step = last_step.max(step);
        let timestamp = record["t"].as_i64().unwrap_or(end_ms);
        for (key, value) in event.as_object().into_iter().flatten() {
            let skip = matches!(key.as_str(), "event" | "step" | "total_steps");
            if let (false, Some(value)) = (skip, value.as_f64()) {
                out.push(Metric {
                    key: key.clone(),
                    value,
                    timestamp,
                    step,
                });
            }
        }
    }
    for (key, value) in &final_metrics.metrics {
        if !key.starts_with("t_") && value.is_finite() {
            out.push(Metric {
                key: key.clone(),
                value: *value,
                timestamp: end_ms,
                step: last_step,
            });
        }
    }
    out
}

/// What orchestrate verified about the stage, as `orchestrate.*` tags: its status, attempts,
/// failure class and error, wall time, output directory, each GPU's UUID, verdict, reclaim
/// time and peak memory (`orchestrate.gpu.N.*`), and each checkpoint's checksum
/// (`orchestrate.checkpoint.PATH`).
pub fn tags(report: &StageReport) -> Vec<(String, String)> {
    let mut out = vec![
        ("orchestrate.status".into(), report.status.as_str().into()),
        ("orchestrate.attempts".into(), report.attempts.to_string()),
        ("orchestrate.output_dir".into(), report.output_dir.clone()),
    ];
    if let Some(failure) = &report.failure {
        out.push(("orchestrate.failure".into(), failure.as_str().into()));
    }
    if let Some(error) = &report.error {
        out.push(("orchestrate.error".into(), error.clone()));
    }
    if let Some(wall) = report.wall_s {
        out.push(("orchestrate.wall_s".into(), format!("{wall:.3}")));
    }
    for (n, gpu) in report.gpu.iter().enumerate() {
        let key = |what: &str| format!("orchestrate.gpu.{n}.{what}");
        out.push((key("uuid"), gpu.uuid.clone()));
        out.push((key("verdict"), gpu.verdict.to_string()));
        out.push((key("reclaim_ms"), format!("{:.1}", gpu.reclaim_ms)));
        out.push((key("peak_mib"), (gpu.peak_bytes >> 20).to_string()));
    }
    for checkpoint in &report.checkpoints {
        out.push((
            format!("orchestrate.checkpoint.{}", tag_key(&checkpoint.path)),
            checkpoint.checksum.to_string(),
        ));
    }
    for (_, value) in &mut out {
        cut(value, TAG_VALUE);
    }
    out
}

/// `path` as a tag key: MLflow takes letters, digits, `_ - . / ` and space.
fn tag_key(path: &str) -> String {
    path.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_-./ ".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Cuts `text` to `limit` characters.
fn cut(text: &mut String, limit: usize) {
    if let Some((at, _)) = text.char_indices().nth(limit) {
        text.truncate(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_events_become_metrics_at_their_steps_and_the_final_ones_at_the_last() {
        let events = concat!(
            r#"{"event":{"event":"started","pid":1},"t":1000,"v":1}"#,
            "\n",
            r#"{"event":{"event":"progress","loss":2.5,"step":2,"tokens_per_s":10.0,"total_steps":4},"t":2000,"v":1}"#,
            "\n",
            r#"{"event":{"event":"progress","loss":1.5,"step":4,"total_steps":4},"t":3000,"v":1}"#,
            "\nnot json\n"
        );
        let mut report: StageReport = serde_json::from_value(serde_json::json!({
            "name": "s", "status": "succeeded", "attempts": 1, "exit_code": 0, "signal": null,
            "error": null, "failure": null, "stderr_tail": null, "output_dir": "/o",
            "checkpoints": [], "wall_s": 1.0, "metrics": {}, "gpu": []
        }))
        .unwrap();
        report.metrics.insert("final_loss".into(), 1.5);
        report.metrics.insert("t_model_ready".into(), 17e8);
        let got: Vec<(String, f64, i64, i64)> = metrics(events, &report, 9000)
            .into_iter()
            .map(|m| (m.key, m.value, m.step, m.timestamp))
            .collect();
        assert_eq!(
            got,
            [
                ("loss".to_string(), 2.5, 2, 2000),
                ("tokens_per_s".to_string(), 10.0, 2, 2000),
                ("loss".to_string(), 1.5, 4, 3000),
                ("final_loss".to_string(), 1.5, 4, 9000),
            ]
        );
    }

    #[test]
    fn params_flatten_tables_and_name_the_matrix_values() {
        let stage: Stage = serde_json::from_value(serde_json::json!({
            "name": "ft", "kind": "train",
            "params": {"steps": 3, "data": "a.jsonl", "model": {"d_model": 32}}
        }))
        .unwrap();
        let instance = Instance {
            base: "ft".into(),
            values: vec![("sample".into(), "a.jsonl".into())],
        };
        let got = params(&stage, Some(&instance));
        for want in [
            ("kind", "train"),
            ("steps", "3"),
            ("data", "a.jsonl"),
            ("model.d_model", "32"),
            ("matrix.sample", "a.jsonl"),
        ] {
            assert!(
                got.contains(&(want.0.to_string(), want.1.to_string())),
                "{want:?} in {got:?}"
            );
        }
    }
}
