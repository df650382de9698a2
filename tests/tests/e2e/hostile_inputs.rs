//! Hostile inputs and faults (issue 30, items 1–6, 14 and 15), against the real binaries:
//! files a user names that are devices, FIFOs or links out of the run; outputs that never end;
//! a grandchild that escapes with an empty environment; stage names that collide; declared
//! output directories; checkpoint records that lie; a submission's missing `base_dir`.

use e2e_tests::daemon::TestDaemon;
use e2e_tests::{orchestrate, rss_kib, run_plan, spawn_plan, wait_for, Scratch};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` for at most `limit` (then SIGKILL): its output, and how long it took.
fn bounded(cmd: &mut Command, limit: Duration) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    while child.try_wait().unwrap().is_none() && started.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    (child.wait_with_output().unwrap(), started.elapsed())
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid, NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn plans_and_matrix_lines_that_are_devices_or_fifos_are_refused_at_once() {
    let s = Scratch::new("hostile-plan-files");
    let fifo = s.path().join("plan.fifo");
    mkfifo(&fifo);
    let lines_plan = |lines: &str| {
        format!(
            "[[stage]]\nname = \"m\"\ncommand = [\"true\"]\nmatrix = {{ v = {{ lines = \"{lines}\" }} }}\n"
        )
    };
    let zero_lines = s.write("zero-lines.toml", &lines_plan("/dev/zero"));
    let fifo_lines = s.write("fifo-lines.toml", &lines_plan(fifo.to_str().unwrap()));
    let cases: Vec<(Vec<String>, String, &str)> = vec![
        (
            vec!["validate".into(), "/dev/zero".into()],
            "/dev/zero".into(),
            "character device",
        ),
        (
            vec!["--plan".into(), "/dev/zero".into()],
            "/dev/zero".into(),
            "character device",
        ),
        (
            vec!["validate".into(), fifo.display().to_string()],
            fifo.display().to_string(),
            "FIFO",
        ),
        (
            vec!["--plan".into(), fifo.display().to_string()],
            fifo.display().to_string(),
            "FIFO",
        ),
        (
            vec!["validate".into(), zero_lines.display().to_string()],
            "/dev/zero".into(),
            "character device",
        ),
        (
            vec!["validate".into(), fifo_lines.display().to_string()],
            fifo.display().to_string(),
            "FIFO",
        ),
    ];
    for (args, names, says) in cases {
        let mut cmd = Command::new(orchestrate());
        cmd.args(&args).arg("--run-dir").arg(s.path().join("run"));
        if args[0] == "validate" {
            cmd = Command::new(orchestrate());
            cmd.args(&args);
        }
        let (out, took) = bounded(&mut cmd, Duration::from_secs(20));
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(took < Duration::from_secs(5), "{args:?} took {took:?}");
        assert!(stderr.contains(&names), "{args:?} names the file: {stderr}");
        assert!(stderr.contains(says), "{args:?} says what it is: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// Sends one request on a new connection and returns the answer, which must come within 10 s.
fn call(d: &TestDaemon, request: Value) -> Value {
    d.connect().call_within(request, Duration::from_secs(10))
}

#[test]
fn the_daemon_refuses_device_and_fifo_plan_paths_and_keeps_answering() {
    let s = Scratch::new("hostile-daemon-paths");
    let d = TestDaemon::start_in(&s, "daemon.log");
    let answer = call(
        &d,
        json!({"v": 1, "type": "submit", "plan": {"path": "/dev/zero"}}),
    );
    assert_eq!(answer["type"], "error", "{answer}");
    let message = answer["error"].to_string();
    assert!(
        message.contains("/dev/zero") && message.contains("character device"),
        "{answer}"
    );
    // Many FIFO submissions: each refused at once, none leaves a thread blocked in open().
    let fifo = s.path().join("plan.fifo");
    mkfifo(&fifo);
    for _ in 0..40 {
        let answer = call(
            &d,
            json!({"v": 1, "type": "submit", "plan": {"path": fifo}}),
        );
        assert_eq!(answer["type"], "error", "{answer}");
        assert!(answer["error"].to_string().contains("FIFO"), "{answer}");
    }
    let threads = std::fs::read_dir(format!("/proc/{}/task", d.pid()))
        .unwrap()
        .count();
    assert!(threads < 30, "{threads} daemon threads");
    // A real submission still runs to its end, and the daemon stayed small.
    let answer = call(
        &d,
        json!({"v": 1, "type": "submit",
        "plan": {"toml": "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n"}, "base_dir": s.path()}),
    );
    assert_eq!(answer["type"], "submitted", "{answer}");
    let id = answer["id"].as_str().unwrap();
    let done = call(&d, json!({"v": 1, "type": "wait", "id": id}));
    assert_eq!(done["type"], "finished", "{done}");
    let rss = rss_kib(d.pid());
    assert!(rss < 200 * 1024, "{rss} KiB");
}

#[test]
fn a_missing_or_non_directory_base_dir_is_refused_at_submit() {
    let s = Scratch::new("hostile-base-dir");
    let d = TestDaemon::start_in(&s, "daemon.log");
    let file = s.write("a-file", "x");
    let plan = json!({"toml": "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n"});
    for (base, says) in [
        (s.path().join("nowhere"), "it does not exist"),
        (file, "it is a file"),
    ] {
        let answer = call(
            &d,
            json!({"v": 1, "type": "submit", "plan": plan, "base_dir": base}),
        );
        assert_eq!(answer["type"], "error", "{answer}");
        let message = answer["error"].as_str().unwrap();
        assert!(message.contains(base.to_str().unwrap()), "{message}");
        assert!(message.contains(says), "{message}");
    }
    // The runs directory holds the daemon's lock file, and no run directory.
    let runs = std::fs::read_dir(s.path().join("runs"))
        .map(|d| d.flatten().filter(|e| e.path().is_dir()).count())
        .unwrap_or(0);
    assert_eq!(runs, 0, "no run was started");
}

#[test]
fn outputs_that_are_devices_fifos_or_links_out_fail_the_stage_at_once() {
    let s = Scratch::new("hostile-outputs");
    let secret = s.write("secret.txt", "not the stage's\n");
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[[stage]]
name = "zero"
command = ["sh", "-c", "ln -s /dev/zero {{output}}/weights.bin"]
outputs = ["weights.bin"]

[[stage]]
name = "fifo"
command = ["sh", "-c", "mkfifo {{output}}/weights.bin"]
outputs = ["weights.bin"]

[[stage]]
name = "link-out"
command = ["sh", "-c", "ln -s {secret} {{output}}/weights.bin"]
outputs = ["weights.bin"]
"#,
            secret = secret.display()
        ),
    );
    let mut cmd = Command::new(orchestrate());
    cmd.arg("--plan")
        .arg(&plan)
        .arg("--run-dir")
        .arg(s.path().join("run"));
    let (out, took) = bounded(&mut cmd, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(s.path().join("run/report.json")).unwrap())
            .unwrap();
    for (name, says) in [
        ("zero", "/dev/zero, outside the stage's output directory"),
        ("fifo", "is a FIFO (named pipe)"),
        (
            "link-out",
            "secret.txt, outside the stage's output directory",
        ),
    ] {
        let rec = report["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap();
        assert_eq!(rec["failure"], "corrupt_output", "{name}: {rec}");
        let error = rec["error"].as_str().unwrap();
        assert!(error.contains("weights.bin"), "{name}: {error}");
        assert!(error.contains(says), "{name}: {error}");
        assert!(
            rec["checkpoints"].as_array().is_none_or(|c| c.is_empty()),
            "{rec}"
        );
    }
}

#[test]
fn a_signal_stops_the_hashing_of_a_huge_output_at_once() {
    let s = Scratch::new("hostile-huge-output");
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "huge"
command = ["sh", "-c", "truncate -s 64G {output}/sparse.bin && touch {output}/../written"]
outputs = ["sparse.bin"]
"#,
    );
    let (mut child, run_dir) = spawn_plan(&s, &plan);
    let written = run_dir.join("stages/huge/written");
    assert!(
        wait_for(Duration::from_secs(30), || written.exists()),
        "the stage wrote its output"
    );
    // Hashing 64 GiB takes far longer than this test waits.
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "still verifying");
    let signalled = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let stopped = wait_for(Duration::from_secs(10), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    let took = signalled.elapsed();
    if !stopped {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    assert!(stopped, "SIGTERM ended the run within 10 s");
    assert!(took < Duration::from_secs(3), "it took {took:?}");
    assert_eq!(status.code(), Some(130));
    let journal = std::fs::read_to_string(run_dir.join("journal.jsonl")).unwrap();
    assert!(
        !journal.contains("sparse.bin"),
        "no checkpoint was recorded: {journal}"
    );
}

#[test]
fn a_signal_stops_the_resume_check_of_a_huge_kept_output_at_once() {
    let s = Scratch::new("hostile-huge-resume");
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "huge"
command = ["sh", "-c", "truncate -s 4G {output}/sparse.bin"]
outputs = ["sparse.bin"]

[[stage]]
name = "after"
after = ["huge"]
command = ["false"]
"#,
    );
    // The first run hashes all 4 GiB (recording it), then fails downstream: resumable.
    let started = Instant::now();
    let first = run_plan(&s, &plan, &[]);
    let hashing = started.elapsed();
    assert_eq!(first.code, Some(1), "{}", first.stderr);
    assert_eq!(first.stage("huge")["status"], "succeeded");
    // `--resume` re-hashes the kept output; a SIGTERM during that check ends the run at once.
    let mut child = Command::new(orchestrate())
        .arg("--plan")
        .arg(&plan)
        .arg("--run-dir")
        .arg(&first.run_dir)
        .arg("--resume")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let signalled = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let stopped = wait_for(Duration::from_secs(60), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    let took = signalled.elapsed();
    if !stopped {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    assert!(
        took < Duration::from_secs(3) && took < hashing / 2,
        "stopped after {took:?}; hashing it took {hashing:?}"
    );
    assert_eq!(status.code(), Some(130));
}

fn marker(name: &str) -> String {
    format!("3000.{}{}", std::process::id(), name.len())
}

/// PIDs of live processes one of whose arguments is `arg`.
fn processes_with_arg(arg: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| e2e_tests::alive(pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
        })
        .collect()
}

#[test]
fn a_grandchild_that_escapes_with_an_empty_environment_is_found_and_killed() {
    let s = Scratch::new("hostile-empty-env");
    let m = marker("empty-env");
    // The stage exits once its escaped `sleep` (in a session of its own, its parent gone, no
    // environment at all) has exec'd.
    let until = s.write(
        "until-escaped.sh",
        r#"i=0
while [ $i -lt 200 ]; do
  for f in $(grep -lzxF "$1" /proc/[0-9]*/cmdline 2>/dev/null); do
    [ "$(cat "${f%/cmdline}/comm" 2>/dev/null)" = sleep ] && exit 0
  done
  sleep 0.05; i=$((i + 1))
done
echo "no escaped sleep after 10 s" >&2
exit 1
"#,
    );
    let sleep = ["/bin/sleep", "/usr/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap();
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[[stage]]
name = "escapes"
command = ["sh", "-c", "setsid -f env -i {sleep} {m} > /dev/null 2>&1 < /dev/null; sh {until} {m}"]
"#,
            until = until.display()
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    let leftover = processes_with_arg(&m);
    for pid in &leftover {
        // SAFETY: killing the escaped process this test started, so it does not outlive it.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        leftover.is_empty(),
        "the escaped sleep is gone: {leftover:?}"
    );
    let rec = run.stage("escapes");
    let left = rec["leftover_processes"].as_array().unwrap();
    assert!(
        left.iter().any(|p| p.as_str().unwrap().contains("sleep")),
        "the report names it: {rec}"
    );
}

#[test]
fn stage_names_that_share_an_input_variable_are_refused_naming_both() {
    let s = Scratch::new("hostile-names");
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "a-b"
command = ["true"]

[[stage]]
name = "a_b"
command = ["true"]

[[stage]]
name = "A-B"
command = ["true"]

[[stage]]
name = "use"
after = ["a-b", "a_b", "A-B"]
command = ["true"]
"#,
    );
    let out = Command::new(orchestrate())
        .arg("validate")
        .arg(&plan)
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("ORCHESTRATE_INPUT_A_B"), "{stderr}");
    assert!(stderr.contains("`a-b` on line 3 and `a_b`"), "{stderr}");
    assert!(stderr.contains("`a-b` on line 3 and `A-B`"), "{stderr}");
    // Matrix instances too: `x[v=a-b]` and `x[v=a_b]`.
    let plan = s.write(
        "matrix.toml",
        "[[stage]]\nname = \"x\"\ncommand = [\"true\"]\nmatrix = { v = [\"a-b\", \"a_b\"] }\n",
    );
    let out = Command::new(orchestrate())
        .arg("validate")
        .arg(&plan)
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("`x[v=a-b]` and `x[v=a_b]`"), "{stderr}");
}

#[test]
fn a_declared_directory_is_recorded_file_by_file_and_status_sees_edits() {
    let s = Scratch::new("hostile-output-dir");
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "save"
command = ["sh", "-c", "mkdir -p {output}/ckpt/shard && echo config > {output}/ckpt/config.json && echo weights > {output}/ckpt/shard/0.bin"]
outputs = ["ckpt"]

[[stage]]
name = "whole"
command = ["sh", "-c", "echo a > {output}/a.txt && echo b > {output}/b.txt"]
outputs = ["."]
"#,
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let names = |stage: &str| -> Vec<String> {
        let mut v: Vec<String> = run.stage(stage)["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let p = c["path"].as_str().unwrap();
                p[p.find("/output/").unwrap() + 8..].to_string()
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(names("save"), ["ckpt/config.json", "ckpt/shard/0.bin"]);
    assert_eq!(names("whole"), ["a.txt", "b.txt"]);
    let status = || {
        let out = Command::new(orchestrate())
            .arg("status")
            .arg(&run.run_dir)
            .arg("--json")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["stage"].as_str().unwrap().to_string(),
                    r["resume"].to_string(),
                )
            })
            .collect::<Vec<_>>()
    };
    let before = status();
    assert!(before.iter().all(|(_, r)| r.contains("keep")), "{before:?}");
    // Same size, other bytes, inside the declared directory; a file of "." deleted.
    let out = run.run_dir.join("stages/save/output/ckpt/shard/0.bin");
    std::fs::write(&out, "WEIGHTS\n").unwrap();
    std::fs::remove_file(run.run_dir.join("stages/whole/output/b.txt")).unwrap();
    let after = status();
    for (stage, resume) in &after {
        assert!(!resume.contains("keep"), "{stage} is rerun: {resume}");
        assert!(resume.contains("output"), "{stage}: {resume}");
    }
}

#[test]
fn checkpoint_records_must_be_the_stages_own_files_with_verified_checksums() {
    let s = Scratch::new("hostile-checkpoints");
    let helper = e2e_tests::repo_root().join("python");
    s.write(
        "liar.py",
        r#"
import os, sys, json, socket
sys.path.insert(0, sys.argv[1])
import orchestrate_stage as stage
out = stage.output_dir()
path = out / "model.bin"
path.write_bytes(b"real weights")
st = os.stat(path)
identity = {"dev": st.st_dev, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns}
if sys.argv[2] == "made-up":
    stage._send("checkpoint", path=str(path), sha256="ab" * 32, bytes=st.st_size, identity=identity)
else:
    stage.checkpoint(path)
    # Rewritten in place after the report: same size, modification time restored.
    with open(path, "r+b") as f:
        f.write(b"REAL")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
"#,
    );
    let host = s.write("host.txt", "a host\n");
    // A manifest that lists a file outside the stage's output directory, with its right size
    // and checksum.
    let foreign = s.write(
        "foreign.sh",
        &format!(
            r#"n=$(stat -c %s {host}); sum=$(sha256sum {host} | cut -d' ' -f1)
printf '{{"v":2,"files":[{{"path":"{host}","bytes":%s,"sha256":"%s"}}]}}' "$n" "$sum" > "$ORCHESTRATE_OUTPUT_DIR/manifest.json"
"#,
            host = host.display()
        ),
    );
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[[stage]]
name = "made-up"
command = ["python3", "liar.py", "{helper}", "made-up"]
outputs = ["model.bin"]

[[stage]]
name = "rewritten"
command = ["python3", "liar.py", "{helper}", "rewritten"]
outputs = ["model.bin"]

[[stage]]
name = "foreign-manifest"
command = ["sh", "{foreign}"]
"#,
            helper = helper.display(),
            foreign = foreign.display(),
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    for (name, says) in [
        ("made-up", "the stage reported sha256 abab"),
        ("rewritten", "it changed after it was reported"),
        ("foreign-manifest", "which is not inside its directory"),
    ] {
        let rec = run.stage(name);
        assert_eq!(rec["failure"], "corrupt_output", "{name}: {rec}");
        let error = rec["error"].as_str().unwrap();
        assert!(error.contains(says), "{name}: {error}");
        assert!(
            rec["checkpoints"].as_array().is_none_or(|c| c.is_empty()),
            "{rec}"
        );
    }
}
