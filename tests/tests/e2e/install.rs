//! Installed layouts: `orchestrate` copied alone into a `bin/` (as a wheel or `cargo install`
//! puts it) finds the built-in worker beside itself or on `PATH`, refuses a plan with built-in
//! stages before anything runs when there is none, and `orchestrate doctor` describes the host.

use e2e_tests::{orchestrate, stage_worker, Scratch};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A command stage that leaves `marker` and fails, then a built-in stage after it.
fn plan(marker: &Path) -> String {
    format!(
        r#"
[[stage]]
name = "first"
command = ["sh", "-c", "touch {}; exit 3"]

[[stage]]
name = "train"
kind = "train"
after = ["first"]
"#,
        marker.display()
    )
}

/// `orchestrate` copied into `dir/bin` (a copy: the executable's own directory is where it
/// looks for a worker, and a link would resolve to the build directory).
fn installed(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(orchestrate(), bin.join("orchestrate")).unwrap();
    bin.join("orchestrate")
}

/// Runs the installed copy on PLAN with `path` as `PATH` and no worker named.
fn run_with_path(exe: &Path, dir: &Path, path: &str) -> Output {
    std::fs::write(dir.join("plan.toml"), plan(&dir.join("marker"))).unwrap();
    Command::new(exe)
        .current_dir(dir)
        .args(["--plan", "plan.toml", "--run-dir", "run"])
        .env("PATH", path)
        .env_remove("ORCHESTRATE_WORKER")
        .output()
        .unwrap()
}

#[test]
fn a_builtin_stage_without_a_worker_is_refused_before_anything_runs() {
    let dir = Scratch::new("no-worker");
    let exe = installed(&dir);
    let out = run_with_path(&exe, &dir, "/usr/bin:/bin");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("no stage-worker was found"), "{stderr}");
    assert!(
        stderr.contains("pip install dist/orchestrate_worker-*.whl")
            && stderr.contains("cargo build --release --locked -p stage-worker")
            && stderr.contains("cargo install --locked --path stage-worker"),
        "the refusal names both ways to get a worker: {stderr}"
    );
    assert!(
        !dir.join("marker").exists(),
        "the command stage ran though the run was refused"
    );
}

#[test]
fn a_worker_on_path_is_found() {
    let dir = Scratch::new("worker-on-path");
    let exe = installed(&dir);
    let tools = dir.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::os::unix::fs::symlink(stage_worker(), tools.join("stage-worker")).unwrap();
    let out = run_with_path(&exe, &dir, &format!("{}:/usr/bin:/bin", tools.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Not refused: the first stage ran (and failed, so the built-in one never starts).
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("no stage-worker was found"), "{stderr}");
    assert!(dir.join("marker").exists(), "{stderr}");
}

/// Whether this host has the NVIDIA driver (then the CPU-only wording does not apply).
fn has_nvidia_driver() -> bool {
    Path::new("/proc/driver/nvidia").exists()
}

#[test]
fn doctor_names_every_area_and_the_fix_for_what_is_missing() {
    let dir = Scratch::new("doctor");
    let exe = installed(&dir);
    // No worker beside it or on PATH, no Slurm: both reported missing, the worker with its fix.
    let out = Command::new(&exe)
        .arg("doctor")
        .current_dir(dir.path())
        .env("PATH", "/usr/bin:/bin")
        .env_remove("ORCHESTRATE_WORKER")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    for area in ["gpus", "isolation", "worker", "python", "slurm", "disk"] {
        assert!(
            stdout.lines().any(|l| l.starts_with(area)),
            "no `{area}` line in:\n{stdout}"
        );
    }
    assert!(
        stdout.lines().count() <= 24,
        "more than a screen:\n{stdout}"
    );
    let worker = stdout.lines().find(|l| l.starts_with("worker")).unwrap();
    assert!(
        worker.contains("no stage-worker") && worker.contains("cargo build --release"),
        "{worker}"
    );
    let disk = stdout.lines().find(|l| l.starts_with("disk")).unwrap();
    assert!(disk.contains("GiB free"), "{disk}");
    if !has_nvidia_driver() {
        let gpus = stdout.lines().find(|l| l.starts_with("gpus")).unwrap();
        assert!(
            gpus.contains("no NVIDIA driver found: stages run on the CPU and GPU checks are off"),
            "{gpus}"
        );
    }
}

#[test]
fn a_run_without_the_nvidia_driver_says_so_in_one_line() {
    if has_nvidia_driver() {
        return; // the wording is for hosts without the driver
    }
    let dir = Scratch::new("no-driver");
    std::fs::write(
        dir.join("plan.toml"),
        "[[stage]]\nname = \"s\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let out = Command::new(orchestrate())
        .current_dir(dir.path())
        .args(["--plan", "plan.toml", "--run-dir", "run"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("no NVIDIA driver found: stages run on the CPU and GPU checks are off"),
        "{stderr}"
    );
    assert!(!stderr.contains("libloading"), "{stderr}");
}
