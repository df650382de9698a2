//! The fork server for built-in workers, end to end with the real binaries: a forked worker is
//! supervised, reaped and verified exactly like an exec'd one; killing the server mid-stage
//! leaves nothing behind; a server that has initialised a device is refused; and a checkpoint
//! that orchestrate accepted on the writer's word is still re-hashed on resume.

use e2e_tests::{
    alive, children, cmdline, orchestrate, read_report as report, report_stage as stage,
    stage_pids, Scratch,
};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const FORKED: &str = "started by the fork server";

fn tiny_train(name: &str, steps: u32, init: Option<&str>) -> String {
    let mut s = format!("[[stage]]\nname = \"{name}\"\nkind = \"train\"\n");
    if let Some(init) = init {
        s += &format!("after = [\"{init}\"]\ninit = \"{init}\"\n");
    }
    s += &format!(
        "[stage.params]\nsteps = {steps}\nbatch_size = 4\nseq_len = 32\nseed = 3\n\
         model = {{ d_model = 32, n_layers = 1, n_heads = 2, max_seq_len = 32 }}\n\n"
    );
    s
}

fn run_with_env(plan: &Path, run_dir: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(orchestrate());
    cmd.arg("--plan").arg(plan).arg("--run-dir").arg(run_dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("orchestrate runs")
}

fn stderr_log(run_dir: &Path, stage: &str) -> String {
    std::fs::read_to_string(run_dir.join("stages").join(stage).join("stderr.log")).unwrap()
}

/// PIDs of every attempt of every stage, from the journal.
fn checkpoints(report: &Value, name: &str) -> Vec<(String, String)> {
    stage(report, name)["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let path = PathBuf::from(c["path"].as_str().unwrap());
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            (file, c["blake3"].as_str().unwrap().to_string())
        })
        .collect()
}

#[test]
fn a_forked_worker_is_supervised_and_verified_like_an_exec_d_one() {
    let s = Scratch::new("fork-like-exec");
    let plan = s.write(
        "plan.toml",
        &(tiny_train("a", 6, None) + &tiny_train("b", 6, Some("a"))),
    );
    let forked_dir = s.path().join("forked");
    let out = run_with_env(&plan, &forked_dir, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exec_dir = s.path().join("exec");
    let out = run_with_env(&plan, &exec_dir, &[("ORCHESTRATE_FORK_SERVER", "0")]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (forked, exec) = (report(&forked_dir), report(&exec_dir));
    for name in ["a", "b"] {
        assert!(stderr_log(&forked_dir, name).contains(FORKED), "{name}");
        assert!(!stderr_log(&exec_dir, name).contains(FORKED), "{name}");
        for r in [&forked, &exec] {
            let st = stage(r, name);
            assert_eq!(st["status"], "succeeded");
            assert_eq!(st["exit_code"], 0, "{st}");
            assert_eq!(st["leftover_processes"], serde_json::json!([]), "{st}");
        }
        // The same training gives the same bytes, and orchestrate recorded the checksums
        // of what is on disk.
        let sums = checkpoints(&forked, name);
        assert_eq!(sums.len(), 2, "{sums:?}");
        assert_eq!(sums, checkpoints(&exec, name), "stage {name}");
        for (file, sha) in &sums {
            let path = forked_dir
                .join("stages")
                .join(name)
                .join("output")
                .join(file);
            let bytes = std::fs::read(&path).unwrap();
            use protocol::checkpoint::{Algorithm, Checksum};
            let actual = Checksum::of(Algorithm::Blake3, &bytes);
            assert_eq!(actual.hex(), sha, "{}", path.display());
        }
    }
    // Every worker is gone, and it was reaped by orchestrate (its exit status is known).
    for pid in stage_pids(&forked_dir) {
        assert!(!alive(pid), "worker {pid} outlived the run");
    }
}

#[test]
fn killing_the_fork_server_mid_stage_leaves_nothing_behind() {
    let s = Scratch::new("fork-kill");
    let plan = s.write(
        "plan.toml",
        &(tiny_train("a", 400, None) + &tiny_train("b", 4, Some("a"))),
    );
    let (orch, run_dir) = e2e_tests::spawn_plan_piping_stderr(&s, &plan);
    let orch_pid = orch.id() as i32;
    // Wait until stage a runs (forked) and find the server among orchestrate's children.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (server, worker) = loop {
        assert!(Instant::now() < deadline, "stage a never started");
        let pids = if run_dir.join("journal.jsonl").exists() {
            stage_pids(&run_dir)
        } else {
            Vec::new()
        };
        let server = children(orch_pid)
            .into_iter()
            .find(|&p| cmdline(p).contains("fork-server") && !pids.contains(&p));
        if let (Some(server), Some(&worker)) = (server, pids.first()) {
            break (server, worker);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(alive(worker));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out = orch.wait_with_output().unwrap();
    let console = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{console}");
    let r = report(&run_dir);
    assert_eq!(
        stage(&r, "a")["status"],
        "succeeded",
        "the running stage is not the server's"
    );
    assert!(stderr_log(&run_dir, "a").contains(FORKED));
    assert_eq!(stage(&r, "b")["status"], "succeeded");
    assert!(
        !stderr_log(&run_dir, "b").contains(FORKED),
        "after the server died, workers are exec'd"
    );
    for pid in stage_pids(&run_dir).into_iter().chain([server]) {
        assert!(!alive(pid), "pid {pid} ({}) outlived the run", cmdline(pid));
    }
}

#[test]
fn a_fork_server_that_initialised_a_device_is_refused_and_workers_are_exec_d() {
    let s = Scratch::new("fork-device");
    let flag = s.path().join("device-initialised");
    let plan = s.write(
        "plan.toml",
        &(tiny_train("a", 3, None)
            + &format!(
                "[[stage]]\nname = \"touch\"\nafter = [\"a\"]\ncommand = [\"touch\", \"{}\"]\n\n",
                flag.display()
            )
            + &tiny_train("b", 3, Some("a")).replace("after = [\"a\"]", "after = [\"touch\"]")),
    );
    let run_dir = s.path().join("run");
    let out = run_with_env(
        &plan,
        &run_dir,
        &[(
            protocol::fork::ENV_SIMULATED_DEVICE_FLAG,
            flag.to_str().unwrap(),
        )],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stderr_log(&run_dir, "a").contains(FORKED));
    assert!(
        !stderr_log(&run_dir, "b").contains(FORKED),
        "the server refused once the device flag was set"
    );
    assert_eq!(stage(&report(&run_dir), "b")["status"], "succeeded");
}

#[test]
fn a_checkpoint_corrupted_after_its_stage_finished_is_caught_on_resume() {
    let s = Scratch::new("fork-corrupt");
    let plan = s.write(
        "plan.toml",
        &(tiny_train("a", 3, None) + &tiny_train("b", 3, Some("a"))),
    );
    let run_dir = s.path().join("run");
    let out = run_with_env(&plan, &run_dir, &[]);
    assert_eq!(out.status.code(), Some(0));
    // Flip one byte of a's weights, keeping size and modification time: only a full
    // re-hash can tell.
    let path = run_dir.join("stages/a/output/model.safetensors");
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let i = bytes.len() - 5;
    bytes[i] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();

    let out = Command::new(orchestrate())
        .arg("resume")
        .arg(&run_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("model.safetensors"), "{stderr}");
    let starts = |name: &str| {
        std::fs::read_to_string(run_dir.join("journal.jsonl"))
            .unwrap()
            .lines()
            .filter(|l| {
                l.contains("\"stage_started\"") && l.contains(&format!("\"stage\":\"{name}\""))
            })
            .count()
    };
    assert_eq!(starts("a"), 2, "a reruns");
    assert_eq!(starts("b"), 2, "b, downstream of a, reruns");
    // The rerun wrote a fresh, consistent checkpoint.
    let r = report(&run_dir);
    assert_eq!(stage(&r, "a")["status"], "succeeded");
    assert_ne!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn a_train_stage_from_a_corrupted_init_fails_before_writing_a_checkpoint() {
    // The init checkpoint's checksum is computed while the stage builds and trains; a byte
    // flipped in the weights (after orchestrate verified them) must still stop the stage
    // before it writes anything derived from them.
    let s = Scratch::new("fork-corrupt-init");
    let plan = s.write(
        "plan.toml",
        &(tiny_train("a", 3, None)
            + "[[stage]]\nname = \"vandal\"\nafter = [\"a\"]\ncommand = [\"sh\", \"-c\", \
               \"f={input.a}/model.safetensors; printf Z | dd of=$f bs=1 seek=$(($(stat -c %s $f) - 9)) conv=notrunc\"]\n\n"
            + &tiny_train("b", 3, Some("a")).replace("after = [\"a\"]", "after = [\"vandal\"]")),
    );
    let run_dir = s.path().join("run");
    let out = run_with_env(&plan, &run_dir, &[]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&run_dir);
    let b = stage(&r, "b");
    assert_eq!(b["failure"], "bad_input", "{b}");
    let error = b["error"].as_str().unwrap();
    assert!(error.contains("model.safetensors is corrupted"), "{error}");
    assert!(
        !run_dir.join("stages/b/output/manifest.json").exists(),
        "no checkpoint from corrupted weights"
    );
}
