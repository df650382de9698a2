//! A real PyTorch script as a stage (the worked example in examples/python-stage), reporting
//! through the stdlib-only helper python/orchestrate_stage.py.

use e2e_tests::{repo_root, run_plan, Scratch};
use std::process::Command;

#[test]
fn a_python_training_script_reports_metrics_and_a_verified_checkpoint() {
    let s = Scratch::new("python-stage");
    let plan = repo_root().join("examples/python-stage/plan.toml");
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let loss = run.metric("train", "final_loss");
    assert!(loss < 1.0, "the tiny regression trained: {loss}");
    assert_eq!(run.metric("train", "steps"), 300.0);
    // The checkpoint the script reported is the one on disk.
    let events = std::fs::read_to_string(run.run_dir.join("stages/train/events.jsonl")).unwrap();
    let reported = events
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["event"]["event"] == "checkpoint")
        .expect("a checkpoint event");
    // The script hashed it with SHA-256 as it wrote it; orchestrate, finding the very file
    // (identity and size) it reported, recorded that checksum without reading the file again.
    let recorded = run.stage("train")["checkpoints"][0].clone();
    assert!(reported["event"]["sha256"].is_string(), "{reported}");
    assert_eq!(
        reported["event"]["sha256"], recorded["sha256"],
        "{reported} vs {recorded}"
    );
    assert!(
        run.stderr.contains("train: step 300/300"),
        "progress reached the console"
    );
    let inspect = std::fs::read_to_string(run.run_dir.join("stages/inspect/stdout.log")).unwrap();
    assert!(inspect.contains("trained for 300 steps"), "{inspect}");
}

#[test]
fn the_helper_is_inert_outside_orchestrate() {
    let s = Scratch::new("python-alone");
    let out = Command::new("python3")
        .arg(repo_root().join("examples/python-stage/train_tiny.py"))
        .arg("20")
        .current_dir(s.path())
        .env("PYTHONPATH", repo_root().join(".libtorch"))
        .env("PYTHONWARNINGS", "ignore")
        .env_remove("ORCHESTRATE_EVENTS")
        .env_remove("ORCHESTRATE_OUTPUT_DIR")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        s.path().join("model.pt").is_file(),
        "outputs land in the current directory"
    );
}

#[test]
fn python_stages_in_a_matrix_land_in_the_results_table() {
    let s = Scratch::new("python-matrix");
    let script = repo_root().join("examples/python-stage/train_tiny.py");
    let libtorch = repo_root().join(".libtorch");
    let plan = s.write(
        "plan.toml",
        &format!(
            "[[stage]]\nname = \"fit\"\nmatrix = {{ steps = [100, 300] }}\ncommand = [\"python3\", \"{}\", \"{{matrix.steps}}\"]\noutputs = [\"model.pt\"]\nenv = {{ PYTHONPATH = \"{}\", PYTHONWARNINGS = \"ignore\" }}\n",
            script.display(),
            libtorch.display()
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.run_dir.join("results.json")).unwrap())
            .unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        let steps: f64 = row["steps"].as_str().unwrap().parse().unwrap();
        assert_eq!(row["status"], "succeeded");
        assert_eq!(row["instance"], format!("fit[steps={steps}]"));
        assert_eq!(
            row["metric.steps"].as_f64(),
            Some(steps),
            "the metric keeps its own column"
        );
    }
    let loss = |i: usize| rows[i]["final_loss"].as_f64().unwrap();
    assert!(loss(1) < loss(0), "more steps, lower loss: {rows:?}");
    let csv = std::fs::read_to_string(run.run_dir.join("results.csv")).unwrap();
    assert!(csv.lines().next().unwrap().contains("final_loss"), "{csv}");
}

#[test]
fn the_stage_helper_needs_only_the_standard_library_when_copied_next_to_a_script() {
    let s = Scratch::new("python-helper-copy");
    // As a user copies it: the package's core, one file, beside the script.
    std::fs::copy(
        repo_root().join("python/orchestrate_stage/__init__.py"),
        s.path().join("orchestrate_stage.py"),
    )
    .unwrap();
    let script = "import os, signal, sys\n\
        import orchestrate_stage as stage\n\
        assert stage.watch_stop()\n\
        os.kill(os.getpid(), signal.SIGTERM)\n\
        assert stage.stop_requested(), 'SIGTERM became a stop request'\n\
        stage.progress(1)\n\
        stage.exit_interrupted()\n";
    // -S: no site-packages, so any import beyond the standard library would fail.
    let out = Command::new("python3")
        .args(["-S", "-c", script])
        .current_dir(s.path())
        .env_remove("PYTHONPATH")
        .env_remove("ORCHESTRATE_EVENTS")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(75),
        "stopped with the resumable code: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// SIGTERM that keeps coming (a stop sent to the process group and to each process, Slurm's
/// own signals on top) is one stop request: the handler takes no lock, so a second signal
/// landing while the first is handled cannot deadlock the stage before it saves.
#[test]
fn a_burst_of_sigterms_is_one_stop_request_and_never_hangs_the_stage() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let s = Scratch::new("python-sigterm-burst");
    std::fs::copy(
        repo_root().join("python/orchestrate_stage/__init__.py"),
        s.path().join("orchestrate_stage.py"),
    )
    .unwrap();
    // Pure-Python work between checks, so signals land in the middle of bytecode, and more
    // of them after the request was seen (none during exit, where Python has put back the
    // default handler).
    let script = "import time\n\
        import orchestrate_stage as stage\n\
        assert stage.watch_stop()\n\
        print('ready', flush=True)\n\
        while not stage.stop_requested():\n    sum(range(500))\n\
        end = time.monotonic() + 1.0\n\
        while time.monotonic() < end:\n    sum(range(500))\n\
        stage.exit_interrupted()\n";
    for round in 0..6 {
        let mut child = Command::new("python3")
            .args(["-S", "-c", script])
            .current_dir(s.path())
            .env_remove("PYTHONPATH")
            .env_remove("ORCHESTRATE_EVENTS")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut ready = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut ready)
            .unwrap();
        assert_eq!(ready.trim(), "ready");
        let pid = Pid::from_raw(child.id() as i32);
        // Bursts for 0.3 s, while the script still runs: it loops for 1 s after the first.
        let burst_until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < burst_until {
            for _ in 0..50 {
                let _ = kill(pid, Signal::SIGTERM);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let status = status.unwrap_or_else(|| panic!("round {round}: hung in its SIGTERM handler"));
        assert_eq!(status.code(), Some(75), "round {round}: {status:?}");
    }
}
