//! Helpers shared by the end-to-end tests: where the built binaries are, scratch directories,
//! running `orchestrate` and reading what a run left behind.
//!
//! The binaries come from `cargo build --bins` (the README's test command builds them first).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod daemon;
pub mod fixtures;
pub mod http;
pub mod idle_flood;
pub mod mlflow;

/// The directory holding the workspace's built binaries (`target/debug` for `cargo test`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/debug/deps/<test> → target/debug
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps")
        .to_path_buf();
    for bin in ["orchestrate", "stage-worker"] {
        assert!(
            dir.join(bin).is_file(),
            "{} is missing: build the binaries first (`cargo build --bins`, which scripts/test does)",
            dir.join(bin).display()
        );
    }
    dir
}

/// Path of the `orchestrate` binary.
pub fn orchestrate() -> PathBuf {
    bin_dir().join("orchestrate")
}

/// Path of the `stage-worker` binary.
pub fn stage_worker() -> PathBuf {
    bin_dir().join("stage-worker")
}

/// Whether `program` is on PATH (Debian's `package` has it); panics under CI when it is not, as a
/// test without it would prove nothing (the set-up scripts install it).
pub fn have(program: &str, package: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false");
    assert!(
        found || !ci,
        "{program} is missing: install Debian's {package} (scripts/test does)"
    );
    if !found {
        eprintln!("skipped: {program} is not installed (Debian's {package})");
    }
    found
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the repository root")
        .to_path_buf()
}

/// The framework venv's python (`ORCHESTRATE_TEST_PYTHON`: torch, numpy, transformers,
/// accelerate, lightning and `./python` installed; scripts/test sets it up), or None (test
/// skipped) outside CI when there is none: under CI (`CI=true`) a missing one fails the test,
/// elsewhere `.venv-frameworks/` is tried.
pub fn framework_python() -> Option<PathBuf> {
    let python = match std::env::var_os("ORCHESTRATE_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => panic!(
            "ORCHESTRATE_TEST_PYTHON is not set: under CI the framework tests must run \
             (scripts/test sets it up with scripts/setup-python-frameworks)"
        ),
        None => {
            let fallback = repo_root().join(".venv-frameworks/bin/python");
            if !fallback.exists() {
                eprintln!(
                    "skipped: no framework venv (run scripts/setup-python-frameworks, or set \
                     ORCHESTRATE_TEST_PYTHON)"
                );
                return None;
            }
            fallback
        }
    };
    assert!(
        python.exists(),
        "ORCHESTRATE_TEST_PYTHON={} does not exist",
        python.display()
    );
    Some(python)
}

/// `orchestrate` with the framework venv of `python` first on PATH, as a user with the venv
/// activated runs it (plans say `python3`). One thread per stage: two tests' stages share the
/// 2-core CI machine, and oversubscribed PyTorch threads make a step ten times slower.
pub fn orchestrate_with(python: &Path) -> Command {
    let bin = python.parent().expect("venv bin directory");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![bin.to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    let mut cmd = Command::new(orchestrate());
    cmd.env("PATH", std::env::join_paths(dirs).unwrap())
        .env("VIRTUAL_ENV", bin.parent().unwrap())
        .env("OMP_NUM_THREADS", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONWARNINGS", "ignore")
        .env_remove("PYTHONPATH");
    cmd
}

/// A fresh scratch directory for one test, removed when dropped unless the test panicked (then
/// its path is printed and the files stay for a look). Every test of the workspace that needs
/// files takes one: nothing is left in the system's temporary directory.
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// Creates `target/e2e-scratch/<name>-<pid>-<n>`.
    pub fn new(name: &str) -> Scratch {
        static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = repo_root()
            .join("target")
            .join("e2e-scratch")
            .join(format!("{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create scratch dir");
        Scratch { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `content` to `name` inside the directory and returns its path.
    pub fn write(&self, name: &str, content: &str) -> PathBuf {
        let p = self.path.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, content).unwrap();
        p
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept the failed test's files: {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// What one `orchestrate --plan` run produced.
pub struct RunResult {
    /// Exit status code (None if killed by a signal).
    pub code: Option<i32>,
    /// Everything it printed.
    pub stdout: String,
    /// Its console output.
    pub stderr: String,
    /// The run directory.
    pub run_dir: PathBuf,
}

/// The `report.json` of the run in `run_dir`, parsed.
pub fn read_report(run_dir: &Path) -> serde_json::Value {
    let path = run_dir.join("report.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("report.json parses")
}

/// The record of stage `name` in a parsed report.
pub fn report_stage<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["stages"]
        .as_array()
        .expect("stages array")
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no stage {name} in {report}"))
}

impl RunResult {
    /// `report.json`, parsed.
    pub fn report(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.run_dir.join("report.json")).unwrap_or_else(|e| {
            panic!(
                "no report.json in {}: {e}\nstderr:\n{}",
                self.run_dir.display(),
                self.stderr
            )
        });
        serde_json::from_str(&text).expect("report.json parses")
    }

    /// The report record of stage `name`.
    pub fn stage(&self, name: &str) -> serde_json::Value {
        report_stage(&self.report(), name).clone()
    }

    /// A metric of stage `name`.
    pub fn metric(&self, name: &str, metric: &str) -> f64 {
        self.stage(name)["metrics"][metric]
            .as_f64()
            .unwrap_or_else(|| panic!("stage {name} has no metric {metric}: {}", self.stage(name)))
    }
}

/// Runs `orchestrate --plan <plan> --run-dir <dir>/run` and waits for it.
pub fn run_plan(scratch: &Scratch, plan: &Path, extra: &[&str]) -> RunResult {
    run_plan_with(Command::new(orchestrate()), scratch, plan, extra)
}

/// [`run_plan`] with `orchestrate` started by `cmd` (its own environment, say).
pub fn run_plan_with(
    mut cmd: Command,
    scratch: &Scratch,
    plan: &Path,
    extra: &[&str],
) -> RunResult {
    let run_dir = scratch.path().join("run");
    let out: Output = cmd
        .arg("--plan")
        .arg(plan)
        .arg("--run-dir")
        .arg(&run_dir)
        .args(extra)
        .output()
        .expect("orchestrate runs");
    RunResult {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        run_dir,
    }
}

/// Starts `orchestrate --plan <plan> --run-dir <dir>/run` in the background (output discarded)
/// and returns it with its run directory, for tests that signal it.
pub fn spawn_plan(scratch: &Scratch, plan: &Path) -> (std::process::Child, PathBuf) {
    spawn_plan_to(scratch, plan, std::process::Stdio::null())
}

/// [`spawn_plan`] with its stderr piped to the test (read it: `wait_with_output`), for tests
/// that show the console when the run fails.
pub fn spawn_plan_piping_stderr(scratch: &Scratch, plan: &Path) -> (std::process::Child, PathBuf) {
    spawn_plan_to(scratch, plan, std::process::Stdio::piped())
}

fn spawn_plan_to(
    scratch: &Scratch,
    plan: &Path,
    stderr: std::process::Stdio,
) -> (std::process::Child, PathBuf) {
    let run_dir = scratch.path().join("run");
    let child = Command::new(orchestrate())
        .arg("--plan")
        .arg(plan)
        .arg("--run-dir")
        .arg(&run_dir)
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("orchestrate starts");
    (child, run_dir)
}

// The tests read `/proc` with these helpers of their own rather than the orchestrator's
// `proctree`, so that a bug there cannot hide itself from the tests that check its outcome.

/// The fields of `/proc/<pid>/stat` after the command name (state, parent, group, session,
/// …), found after its last `)`: the name may hold any character. `None` when it is gone.
fn stat_after_name(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().map(String::from).collect())
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    let state = stat_after_name(pid).and_then(|f| f.into_iter().next());
    !matches!(state.as_deref(), Some("Z") | Some("X") | None)
}

/// The processes of session `sid` (zombies not reaped yet included), each as
/// `PID STATE COMMAND` for a failure's message.
pub fn session_members(sid: i32) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let fields = stat_after_name(pid)?;
            (fields.get(3)? == &sid.to_string())
                .then(|| format!("{pid} {} {}", fields[0], cmdline(pid)))
        })
        .collect()
}

/// The children of process `pid` (every thread's), from `/proc/<pid>/task/*/children`.
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// PIDs of live (non-zombie) processes whose environment contains `needle` (`KEY=VALUE`).
pub fn processes_with_env(needle: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| alive(pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|e| e == needle.as_bytes()))
        })
        .collect()
}

/// Polls `cond` every 10 ms until it holds or `limit` has passed; whether it held.
pub fn wait_for(limit: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    cond()
}

/// Every complete record of a run's journal (none when it does not exist yet).
pub fn journal_records(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("journal.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The stages that journal `records` record as succeeded, in the order recorded.
pub fn succeeded_stages(records: &[serde_json::Value]) -> Vec<String> {
    records
        .iter()
        .filter(|r| r["rec"] == "stage_finished" && r["status"] == "succeeded")
        .filter_map(|r| r["stage"].as_str().map(String::from))
        .collect()
}

/// The first process of every attempt the run's journal records as started, in order.
pub fn stage_pids(run_dir: &Path) -> Vec<i32> {
    journal_records(run_dir)
        .iter()
        .filter(|r| r["rec"] == "stage_started")
        .filter_map(|r| r["pid"].as_i64().map(|p| p as i32))
        .collect()
}

/// A process's command line, its arguments joined by spaces (empty once it is gone).
pub fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// `orchestrate --plan PLAN --run-dir <scratch>/run` on `gpus` stand-in GPUs (a count or a
/// list of memory sizes, as `ORCHESTRATE_FAKE_GPUS` takes them) whose holder files are in
/// `holders` (created).
pub fn fake_gpu_command(s: &Scratch, plan: &Path, gpus: &str, holders: &Path) -> Command {
    std::fs::create_dir_all(holders).unwrap();
    let mut cmd = Command::new(orchestrate());
    cmd.arg("--plan")
        .arg(plan)
        .arg("--run-dir")
        .arg(s.path().join("run"))
        .env("ORCHESTRATE_FAKE_GPUS", gpus)
        .env("ORCHESTRATE_FAKE_GPU_DIR", holders);
    cmd
}

/// A finished command's exit status, stdout and stderr, for an assertion's message.
pub fn output_text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A live process's resident memory (`VmRSS`), in KiB.
pub fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// How many attempts of `stage` the run's journal records as started.
pub fn stage_starts(run_dir: &Path, stage: &str) -> usize {
    journal_records(run_dir)
        .iter()
        .filter(|r| r["rec"] == "stage_started" && r["stage"] == stage)
        .count()
}

#[cfg(test)]
mod tests {
    use super::Scratch;

    #[test]
    fn a_scratch_directory_is_removed_when_dropped_and_kept_when_its_test_fails() {
        let scratch = Scratch::new("scratch-self");
        let path = scratch.path().to_path_buf();
        scratch.write("a/b.txt", "x");
        assert!(path.join("a/b.txt").is_file());
        drop(scratch);
        assert!(!path.exists(), "removed on drop");

        // Dropped while unwinding from a panic, as a failing test's is.
        let scratch = Scratch::new("scratch-failed");
        let kept = scratch.path().to_path_buf();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _scratch = scratch;
            panic!("a failing test");
        }))
        .unwrap_err();
        assert!(kept.is_dir(), "a failed test's files stay");
        std::fs::remove_dir_all(kept).unwrap();
    }
}
