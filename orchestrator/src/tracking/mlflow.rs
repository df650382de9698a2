//! The few calls of MLflow's REST API (version 2.0) that tracking needs: find or create an
//! experiment, create a run (nested under another through the `mlflow.parentRunId` tag), log
//! params, metrics and tags in batches, and end a run. Plain HTTP; every call has a deadline,
//! so an unreachable server costs a run seconds, never a hang.

use std::time::Duration;

/// How long one call may take, connection included.
const CALL_DEADLINE: Duration = Duration::from_secs(10);

/// MLflow's limits on one `log-batch` call.
const BATCH_METRICS: usize = 1000;
const BATCH_PARAMS: usize = 100;
const BATCH_TAGS: usize = 100;

/// A metric value at a step, as MLflow stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub key: String,
    pub value: f64,
    /// Unix milliseconds.
    pub timestamp: i64,
    pub step: i64,
}

/// How a run ended, in MLflow's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    Finished,
    Failed,
    Killed,
}

impl RunEnd {
    fn word(self) -> &'static str {
        match self {
            RunEnd::Finished => "FINISHED",
            RunEnd::Failed => "FAILED",
            RunEnd::Killed => "KILLED",
        }
    }
}

/// A tracking server at `base` (`http://host:port`, no trailing slash).
pub struct Client {
    base: String,
    agent: ureq::Agent,
}

impl Client {
    /// A client of the server at `uri`; refused (with the reason) for a URI it cannot speak to.
    pub fn new(uri: &str) -> Result<Client, String> {
        let base = uri.trim_end_matches('/');
        if !base.starts_with("http://") {
            return Err(format!(
                "tracking URI {uri:?}: only http:// servers are supported (for https, a local proxy such as `mlflow server` in front)"
            ));
        }
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(CALL_DEADLINE))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(Client {
            base: base.to_string(),
            agent,
        })
    }

    /// The id of the experiment called `name`, created if there is none.
    pub fn experiment(&self, name: &str) -> Result<String, String> {
        let url = format!("{}/api/2.0/mlflow/experiments/get-by-name", self.base);
        let mut answer = self
            .agent
            .get(&url)
            .query("experiment_name", name)
            .call()
            .map_err(|e| format!("{url}: {e}"))?;
        let status = answer.status().as_u16();
        let body = answer.body_mut().read_to_string().unwrap_or_default();
        if status == 200 {
            let value: serde_json::Value =
                serde_json::from_str(&body).map_err(|e| format!("{url}: {e}"))?;
            if let Some(id) = value["experiment"]["experiment_id"].as_str() {
                return Ok(id.to_string());
            }
        } else if !body.contains("RESOURCE_DOES_NOT_EXIST") {
            return Err(format!("{url}: HTTP {status}: {}", short(&body)));
        }
        let created = self.post("experiments/create", serde_json::json!({ "name": name }))?;
        created["experiment_id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("experiments/create answered {created}"))
    }

    /// Creates a run in `experiment` named `name`, started at `start_ms`, under `parent` if
    /// given; its id.
    pub fn create_run(
        &self,
        experiment: &str,
        name: &str,
        start_ms: i64,
        parent: Option<&str>,
    ) -> Result<String, String> {
        let mut tags = vec![serde_json::json!({"key": "mlflow.runName", "value": name})];
        if let Some(parent) = parent {
            tags.push(serde_json::json!({"key": "mlflow.parentRunId", "value": parent}));
        }
        let answer = self.post(
            "runs/create",
            serde_json::json!({
                "experiment_id": experiment,
                "run_name": name,
                "start_time": start_ms,
                "tags": tags,
            }),
        )?;
        answer["run"]["info"]["run_id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("runs/create answered {answer}"))
    }

    /// Logs `params`, `metrics` and `tags` to run `run`, in as many batches as MLflow's limits
    /// need.
    pub fn log(
        &self,
        run: &str,
        params: &[(String, String)],
        metrics: &[Metric],
        tags: &[(String, String)],
    ) -> Result<(), String> {
        let pairs = |list: &[(String, String)]| -> Vec<serde_json::Value> {
            list.iter()
                .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
                .collect()
        };
        for chunk in params.chunks(BATCH_PARAMS) {
            self.post(
                "runs/log-batch",
                serde_json::json!({"run_id": run, "params": pairs(chunk)}),
            )?;
        }
        for chunk in tags.chunks(BATCH_TAGS) {
            self.post(
                "runs/log-batch",
                serde_json::json!({"run_id": run, "tags": pairs(chunk)}),
            )?;
        }
        for chunk in metrics.chunks(BATCH_METRICS) {
            let list: Vec<serde_json::Value> = chunk
                .iter()
                .map(|m| {
                    serde_json::json!({
                        "key": m.key, "value": m.value, "timestamp": m.timestamp, "step": m.step
                    })
                })
                .collect();
            self.post(
                "runs/log-batch",
                serde_json::json!({"run_id": run, "metrics": list}),
            )?;
        }
        Ok(())
    }

    /// Ends run `run` with `end` at `end_ms`.
    pub fn end_run(&self, run: &str, end: RunEnd, end_ms: i64) -> Result<(), String> {
        self.post(
            "runs/update",
            serde_json::json!({"run_id": run, "status": end.word(), "end_time": end_ms}),
        )
        .map(|_| ())
    }

    /// POSTs `body` to `api/2.0/mlflow/<path>`; the answer's JSON, or why there is none.
    fn post(&self, path: &str, body: serde_json::Value) -> Result<serde_json::Value, String> {
        let url = format!("{}/api/2.0/mlflow/{path}", self.base);
        let mut answer = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .map_err(|e| format!("{url}: {e}"))?;
        let status = answer.status().as_u16();
        let text = answer.body_mut().read_to_string().unwrap_or_default();
        if status != 200 {
            return Err(format!("{url}: HTTP {status}: {}", short(&text)));
        }
        serde_json::from_str(&text).map_err(|e| format!("{url}: {e}"))
    }
}

/// The first 300 characters of an answer, for an error message.
fn short(text: &str) -> String {
    text.chars().take(300).collect()
}
