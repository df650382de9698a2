//! A real MLflow tracking server for the tracking tests: `mlflow server` from the venv that
//! scripts/setup-mlflow makes, on a free loopback port with its store in a scratch directory,
//! stopped when dropped; and MLflow's own Python client to read back what was logged.

use crate::http::free_port;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `mlflow` executable (`ORCHESTRATE_TEST_MLFLOW`, else `.venv-mlflow/bin/mlflow`), or None
/// (test skipped) outside CI when there is none; under CI (`CI=true`) a missing one fails.
pub fn mlflow() -> Option<PathBuf> {
    let path = std::env::var_os("ORCHESTRATE_TEST_MLFLOW")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join(".venv-mlflow/bin/mlflow"));
    if path.exists() {
        return Some(path);
    }
    assert!(
        !std::env::var("CI").is_ok_and(|v| v == "true"),
        "no mlflow at {}: under CI the tracking tests must run (scripts/test sets it up with \
         scripts/setup-mlflow)",
        path.display()
    );
    eprintln!("skipped: no MLflow (run scripts/setup-mlflow, or set ORCHESTRATE_TEST_MLFLOW)");
    None
}

/// A running `mlflow server`.
pub struct MlflowServer {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub uri: String,
    python: PathBuf,
}

impl MlflowServer {
    /// Starts `mlflow` as a server with its store under `dir`, and waits (up to 90 s) until it
    /// answers its health check.
    pub fn start(mlflow: &Path, dir: &Path) -> MlflowServer {
        let port = free_port();
        let log = std::fs::File::create(dir.join("mlflow-server.log")).unwrap();
        let child = Command::new(mlflow)
            .args(["server", "--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
            .arg("--default-artifact-root")
            .arg(dir.join("artifacts"))
            .args(["--workers", "1"])
            // No job runner: the tests need none, and its store is a directory the server
            // makes in /dev/shm and leaves there when it is stopped.
            .env("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("mlflow server starts");
        let uri = format!("http://127.0.0.1:{port}");
        let server = MlflowServer {
            child,
            uri,
            python: mlflow.with_file_name("python"),
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        while Instant::now() < deadline {
            let addr = format!("127.0.0.1:{port}");
            let health =
                crate::http::request(&addr, "GET", "/health", &[], b"", Duration::from_secs(2));
            if health.is_ok_and(|a| a.status == 200) {
                return server;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!(
            "mlflow server did not answer within 90 s: {}",
            std::fs::read_to_string(dir.join("mlflow-server.log")).unwrap_or_default()
        );
    }

    /// Runs `script` with MLflow's Python (its client imported as `mlflow`, the server's URI in
    /// `URI`); its stdout parsed as JSON.
    pub fn read_back(&self, script: &str) -> serde_json::Value {
        let out = Command::new(&self.python)
            .arg("-c")
            .arg(format!(
                "import json, mlflow\nURI = {:?}\n{script}",
                self.uri
            ))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        // The server and its workers are one process group.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}
