//! Run directories that cannot be corrupted or lost: one live owner, plans kept in their own
//! format with their base directory, nothing written among a user's files, moves and copies,
//! SIGHUP, long TMPDIR, huge fan-ins, and a full disk. Each test reproduces a way a run
//! directory was once damaged or a run lost.

use e2e_tests::{
    journal_records as journal, orchestrate, output_text as text, processes_with_env,
    read_report as report, spawn_plan, stage_starts as starts, wait_for, Scratch,
};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn orch(args: &[&str], cwd: &Path) -> Output {
    Command::new(orchestrate())
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("orchestrate runs")
}

/// `orchestrate --plan PLAN --run-dir RUN_DIR -q`, run in `cwd`.
fn run_quiet(plan: &Path, run_dir: &Path, cwd: &Path) -> Output {
    orch(
        &[
            "--plan",
            plan.to_str().unwrap(),
            "--run-dir",
            run_dir.to_str().unwrap(),
            "-q",
        ],
        cwd,
    )
}

fn kill(pid: u32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).unwrap();
}

/// A project directory with a plan whose stages use relative paths: a script, a matrix over
/// the lines of a file. `step.sh` fails until `allow` exists beside it.
fn project(s: &Scratch) -> std::path::PathBuf {
    s.write(
        "proj/step.sh",
        "#!/bin/sh\n[ -f \"$(dirname \"$0\")/allow\" ] || { echo not yet >&2; exit 3; }\necho \"$1\" > \"$ORCHESTRATE_OUTPUT_DIR/out\"\n",
    );
    let script = s.path().join("proj/step.sh");
    let mut perms = std::fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&script, perms).unwrap();
    s.write("proj/items.txt", "alpha\nbeta\n");
    s.write(
        "proj/plan.toml",
        r#"
[[stage]]
name = "first"
command = ["sh", "-c", "echo one > {output}/out"]
outputs = ["out"]

[[stage]]
name = "each"
after = ["first"]
matrix = { item = { lines = "items.txt" } }
command = ["./step.sh", "{matrix.item}"]
outputs = ["out"]
"#,
    )
}

#[test]
fn resume_and_status_resolve_relative_paths_against_the_plans_directory() {
    let s = Scratch::new("rel-resume");
    let plan = project(&s);
    let elsewhere = s.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let run_dir = s.path().join("run");
    let out = run_quiet(&plan, &run_dir, &elsewhere);
    assert_eq!(
        out.status.code(),
        Some(1),
        "step.sh fails first: {}",
        text(&out)
    );
    assert!(run_dir.join("run.json").is_file());
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(
        Path::new(meta["base_dir"].as_str().unwrap()),
        std::fs::canonicalize(s.path().join("proj")).unwrap()
    );

    // From yet another directory: status and resume find step.sh and items.txt.
    let status = orch(&["status", run_dir.to_str().unwrap()], &elsewhere);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status));
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(shown.contains("each[item=alpha]"), "{shown}");
    assert!(shown.contains("first") && shown.contains("keep"), "{shown}");

    std::fs::write(s.path().join("proj/allow"), "").unwrap();
    let resumed = orch(&["resume", run_dir.to_str().unwrap(), "-q"], &elsewhere);
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    assert_eq!(
        starts(&run_dir, "first"),
        1,
        "the finished stage is not rerun"
    );
    assert_eq!(
        std::fs::read_to_string(run_dir.join("stages/each[item=beta]/output/out")).unwrap(),
        "beta\n"
    );
}

#[test]
fn a_json_plan_is_kept_as_json_and_its_run_resumes() {
    let s = Scratch::new("json-plan");
    let marker = s.path().join("allow");
    let plan = s.write(
        "plan.json",
        &serde_json::json!({
            "stage": [
                {"name": "a", "command": ["sh", "-c", "echo a > {output}/out"], "outputs": ["out"]},
                {"name": "b", "after": ["a"], "command": ["sh", "-c", format!("test -f {}", marker.display())]}
            ]
        })
        .to_string(),
    );
    let run_dir = s.path().join("run");
    let out = run_quiet(&plan, &run_dir, s.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        run_dir.join("plan.json").is_file(),
        "kept in its own format"
    );
    assert!(!run_dir.join("plan.toml").exists());
    let status = orch(&["status", run_dir.to_str().unwrap()], s.path());
    assert_eq!(status.status.code(), Some(0), "{}", text(&status));
    std::fs::write(&marker, "").unwrap();
    let resumed = orch(&["resume", run_dir.to_str().unwrap(), "-q"], s.path());
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    assert_eq!(starts(&run_dir, "a"), 1);
    assert_eq!(starts(&run_dir, "b"), 2);
}

fn slow_plan(s: &Scratch, marker: &str, seconds: f64) -> std::path::PathBuf {
    s.write(
        "plan.toml",
        &format!(
            r#"
[run]
grace = "1s"
[[stage]]
name = "slow"
command = ["sh", "-c", "echo started > {{output}}/started; sleep {seconds}; echo done > {{output}}/out"]
outputs = ["out"]
env = {{ MARKER = "{marker}" }}
[[stage]]
name = "next"
after = ["slow"]
command = ["sh", "-c", "cat {{input.slow}}/out > {{output}}/copy"]
outputs = ["copy"]
"#
        ),
    )
}

#[test]
fn one_live_owner_per_run_directory() {
    let s = Scratch::new("lock");
    let marker = format!("lock-{}", std::process::id());
    let plan = slow_plan(&s, &marker, 3.0);
    let (mut first, run_dir) = spawn_plan(&s, &plan);
    assert!(wait_for(Duration::from_secs(20), || run_dir
        .join("stages/slow/output/started")
        .exists()));
    let pid = first.id();

    // A second run into the same directory, and a resume of the live run: both refused, the
    // owner's pid named, nothing started.
    let second = orch(
        &[
            "--plan",
            plan.to_str().unwrap(),
            "--run-dir",
            run_dir.to_str().unwrap(),
        ],
        s.path(),
    );
    assert_eq!(second.status.code(), Some(4), "{}", text(&second));
    let why = String::from_utf8_lossy(&second.stderr);
    assert!(why.contains(&format!("pid {pid}")), "{why}");
    let resume = orch(&["resume", run_dir.to_str().unwrap()], s.path());
    assert_eq!(resume.status.code(), Some(4), "{}", text(&resume));
    assert!(String::from_utf8_lossy(&resume.stderr).contains(&format!("pid {pid}")));
    // A stage's start reaches the journal with the next record or within a quarter second.
    assert!(wait_for(Duration::from_secs(5), || starts(
        &run_dir, "slow"
    ) > 0));
    assert_eq!(
        starts(&run_dir, "slow"),
        1,
        "no second attempt of the running stage"
    );

    // status and report call it running, not interrupted.
    let status = orch(&["status", run_dir.to_str().unwrap()], s.path());
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("running now"),
        "{}",
        text(&status)
    );
    let shown = orch(&["report", run_dir.to_str().unwrap(), "--json"], s.path());
    let live: Value = serde_json::from_slice(&shown.stdout).expect("report --json");
    assert_eq!(live["status"], "running", "{}", text(&shown));
    // Its table says how far the run has come, not a wall time it does not know.
    let table = orch(&["report", run_dir.to_str().unwrap()], s.path());
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.contains("run running so far, 0 of "), "{table}");
    assert!(!table.contains("running in "), "{table}");

    assert_eq!(first.wait().unwrap().code(), Some(0));
    let records = journal(&run_dir);
    assert_eq!(
        records.iter().filter(|r| r["rec"] == "run_started").count(),
        1,
        "one run wrote the journal"
    );
    // Once the owner is gone (even by kill -9) the directory can be resumed.
    let shown = orch(&["report", run_dir.to_str().unwrap(), "--json"], s.path());
    let done: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(done["status"], "succeeded");
}

#[test]
fn a_killed_owner_releases_the_directory_and_status_says_interrupted() {
    let s = Scratch::new("lock-kill");
    let marker = format!("lock-kill-{}", std::process::id());
    let plan = slow_plan(&s, &marker, 30.0);
    let (mut first, run_dir) = spawn_plan(&s, &plan);
    assert!(wait_for(Duration::from_secs(20), || run_dir
        .join("stages/slow/output/started")
        .exists()));
    kill(first.id(), nix::sys::signal::Signal::SIGKILL);
    first.wait().unwrap();
    let shown = orch(&["report", run_dir.to_str().unwrap(), "--json"], s.path());
    let r: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(r["status"], "interrupted");
    let table = orch(&["report", run_dir.to_str().unwrap()], s.path());
    assert!(
        String::from_utf8_lossy(&table.stdout).contains("orchestrate resume"),
        "{}",
        text(&table)
    );
    assert!(wait_for(Duration::from_secs(5), || processes_with_env(
        &format!("MARKER={marker}")
    )
    .is_empty()));
}

#[test]
fn a_non_empty_directory_that_is_not_a_run_is_never_written() {
    let s = Scratch::new("foreign-dir");
    let proj = s.path().join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    let plan = s.write(
        "proj/plan.toml",
        "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n",
    );
    s.write("proj/report.json", "my own report");
    let out = orch(&["--plan", plan.to_str().unwrap(), "--run-dir", "."], &proj);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a run directory"));
    assert_eq!(
        std::fs::read_to_string(proj.join("report.json")).unwrap(),
        "my own report"
    );
    assert_eq!(
        std::fs::read_to_string(&plan).unwrap(),
        "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n"
    );
    let mut names: Vec<_> = std::fs::read_dir(&proj)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["plan.toml", "report.json"]);

    // --run-dir naming a file, and --resume of a missing directory: clear, with the path.
    let file = s.write("afile", "x");
    let out = orch(
        &[
            "--plan",
            plan.to_str().unwrap(),
            "--run-dir",
            file.to_str().unwrap(),
        ],
        s.path(),
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(file.to_str().unwrap()),
        "{}",
        text(&out)
    );
    let missing = s.path().join("nope");
    let out = orch(&["resume", missing.to_str().unwrap()], s.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not exist"),
        "{}",
        text(&out)
    );
    for cmd in ["status", "report"] {
        let out = orch(&[cmd, missing.to_str().unwrap()], s.path());
        assert_eq!(out.status.code(), Some(2), "{cmd}: {}", text(&out));
    }
}

#[test]
fn a_moved_or_copied_run_directory_resumes_where_it_is() {
    let s = Scratch::new("moved");
    let plan = project(&s);
    let run_dir = s.path().join("run");
    let out = run_quiet(&plan, &run_dir, s.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let moved = s.path().join("moved");
    std::fs::rename(&run_dir, &moved).unwrap();
    std::fs::write(s.path().join("proj/allow"), "").unwrap();
    let copy = s.path().join("copy");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&moved)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());

    let resumed = orch(&["resume", moved.to_str().unwrap(), "-q"], s.path());
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    assert_eq!(starts(&moved, "first"), 1, "`first` kept after the move");

    // The copy verifies its own files: corrupt the copy's output, its `first` reruns while the
    // original stays as it is.
    std::fs::write(copy.join("stages/first/output/out"), "tampered\n").unwrap();
    let resumed = orch(&["resume", copy.to_str().unwrap(), "-q"], s.path());
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    assert_eq!(
        starts(&copy, "first"),
        2,
        "the copy's corrupted output is caught"
    );
    assert_eq!(
        std::fs::read_to_string(moved.join("stages/first/output/out")).unwrap(),
        "one\n"
    );
    let text_journal = std::fs::read_to_string(moved.join("journal.jsonl")).unwrap();
    for old in [&run_dir, &moved] {
        assert!(
            !text_journal.contains(&format!("{}/stages", old.display())),
            "no absolute path into the run directory in its journal"
        );
    }
}

#[test]
fn sighup_stops_like_sigterm_and_leaves_a_resumable_run() {
    let s = Scratch::new("sighup");
    let marker = format!("sighup-{}", std::process::id());
    let plan = slow_plan(&s, &marker, 30.0);
    let run_dir = s.path().join("run");
    let child = Command::new(orchestrate())
        .args([
            "--plan",
            plan.to_str().unwrap(),
            "--run-dir",
            run_dir.to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(20), || run_dir
        .join("stages/slow/output/started")
        .exists()));
    kill(child.id(), nix::sys::signal::Signal::SIGHUP);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("run interrupted"),
        "a summary is printed: {err}"
    );
    assert!(err.contains("orchestrate resume"), "{err}");
    assert_eq!(report(&run_dir)["stages"][0]["status"], "cancelled");
    let next = &report(&run_dir)["stages"][1];
    assert_eq!(next["status"], "skipped");
    assert_eq!(
        next["failure"], "interrupted",
        "skipped because of the stop, not an upstream failure"
    );
    assert!(processes_with_env(&format!("MARKER={marker}")).is_empty());
}

#[test]
fn a_long_tmpdir_does_not_break_event_sockets_and_no_socket_directory_is_left() {
    let s = Scratch::new("long-tmp");
    let long = s.path().join("t".repeat(60)).join("u".repeat(60));
    std::fs::create_dir_all(&long).unwrap();
    let marker = format!("long-tmp-{}", std::process::id());
    s.write(
        "talk.py",
        "import json, os, socket\nc = socket.socket(socket.AF_UNIX)\nc.connect(os.environ['ORCHESTRATE_EVENTS'])\nc.sendall((json.dumps({'v': 1, 'event': 'metrics', 'metrics': {'x': 7}}) + '\\n').encode())\n",
    );
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[[stage]]
name = "talk"
command = ["sh", "-c", "python3 talk.py && echo sent > {{output}}/sent; sleep 30"]
env = {{ MARKER = "{marker}" }}
"#
        ),
    );
    let run_dir = s.path().join("run");
    let mut child = Command::new(orchestrate())
        .args([
            "--plan",
            plan.to_str().unwrap(),
            "--run-dir",
            run_dir.to_str().unwrap(),
            "-q",
        ])
        .env("TMPDIR", &long)
        .env_remove("XDG_RUNTIME_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || std::fs::read_to_string(
            run_dir.join("stages/talk/events.jsonl")
        )
        .unwrap_or_default()
        .contains("metrics")),
        "the stage's event reached the orchestrator through its socket"
    );
    let pid = child.id();
    // Not under the long $TMPDIR: under /tmp, or /dev/shm (a memory file system, taken first).
    let sockets = || -> Vec<std::path::PathBuf> {
        ["/tmp", "/dev/shm"]
            .into_iter()
            .filter_map(|base| std::fs::read_dir(base).ok())
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("orchestrate-{pid}-")))
            })
            .collect()
    };
    assert_eq!(
        sockets().len(),
        1,
        "the socket directory fell back to /tmp or /dev/shm"
    );
    kill(pid, nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || sockets().is_empty()),
        "the guard removed the socket directory of the killed orchestrator"
    );
    assert!(wait_for(Duration::from_secs(5), || processes_with_env(
        &format!("MARKER={marker}")
    )
    .is_empty()));
}

#[test]
fn an_aggregate_after_a_large_matrix_gets_its_inputs_through_a_file() {
    let s = Scratch::new("fan-in");
    let values: Vec<String> = (0..300).map(|i| format!("{i}")).collect();
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[run]
max_parallel = 8
[[stage]]
name = "each"
matrix = {{ i = [{}] }}
command = ["sh", "-c", "echo {{matrix.i}} > {{output}}/v"]
outputs = ["v"]
[[stage]]
name = "sum"
after = ["each"]
command = ["python3", "-c", "import json,os; d=json.load(open(os.environ['ORCHESTRATE_INPUTS_FILE'])); n=sum(int(open(os.path.join(p,'v')).read()) for p in d.values()); open(os.path.join(os.environ['ORCHESTRATE_OUTPUT_DIR'],'sum'),'w').write(str(n)); assert not any(k.startswith('ORCHESTRATE_INPUT_') for k in os.environ)"]
outputs = ["sum"]
"#,
            values.join(", ")
        ),
    );
    let run_dir = s.path().join("run");
    let out = run_quiet(&plan, &run_dir, s.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(run_dir.join("stages/sum/output/sum")).unwrap(),
        format!("{}", (0..300).sum::<i32>())
    );
}

/// Runs orchestrate with a file-size limit: every write that would grow a file past `bytes`
/// fails with EFBIG, as on a full disk.
fn run_with_file_limit(plan: &Path, run_dir: &Path, bytes: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(orchestrate());
    cmd.args([
        "--plan",
        plan.to_str().unwrap(),
        "--run-dir",
        run_dir.to_str().unwrap(),
    ])
    .stdin(Stdio::null());
    // SAFETY: only async-signal-safe calls (setrlimit, signal) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().unwrap()
}

#[test]
fn a_report_that_cannot_be_written_never_contradicts_the_journal() {
    let s = Scratch::new("disk-full");
    // `b` fails with 4 KiB of stderr: its tail makes the final report too big for the limit,
    // while the journal still fits.
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "a"
command = ["sh", "-c", "echo a > {output}/out"]
outputs = ["out"]
[[stage]]
name = "b"
after = ["a"]
command = ["sh", "-c", "for i in $(seq 1 20); do printf '%0200d\n' $i >&2; done; exit 5"]
"#,
    );
    let run_dir = s.path().join("run");
    let out = run_with_file_limit(&plan, &run_dir, 4096);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("report.json"),
        "the failed write names its file: {err}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&run_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "no temp file left: {leftovers:?}");
    let shown = orch(&["report", run_dir.to_str().unwrap(), "--json"], s.path());
    let r: Value = serde_json::from_slice(&shown.stdout).expect("report --json");
    assert_eq!(r["status"], "failed", "from the journal: {r}");
    let status = |n: &str| {
        r["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|st| st["name"] == n)
            .unwrap()["status"]
            .clone()
    };
    assert_eq!(status("a"), "succeeded");
    assert_eq!(status("b"), "failed");
}

#[test]
fn a_journal_that_cannot_be_written_is_named() {
    let s = Scratch::new("journal-full");
    let mut plan = String::new();
    for i in 0..60 {
        plan.push_str(&format!(
            "[[stage]]\nname = \"s{i}\"\ncommand = [\"true\"]\n"
        ));
    }
    let plan = s.write("plan.toml", &plan);
    let run_dir = s.path().join("run");
    // plan.resolved.json (about 17 KB) fits; the journal (about 25 KB by the end) does not.
    let out = run_with_file_limit(&plan, &run_dir, 19_000);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(run_dir.join("journal.jsonl").to_str().unwrap()),
        "names the journal: {err}"
    );
    let shown = orch(&["report", run_dir.to_str().unwrap(), "--json"], s.path());
    let r: Value = serde_json::from_slice(&shown.stdout).expect("report --json");
    assert_eq!(r["status"], "interrupted", "{r}");
    for st in r["stages"].as_array().unwrap() {
        let name = st["name"].as_str().unwrap();
        let finished = journal(&run_dir).iter().any(|j| {
            j["rec"] == "stage_finished" && j["stage"] == name && j["status"] == "succeeded"
        });
        if finished {
            assert_eq!(st["status"], "succeeded", "{name}");
        } else {
            assert_ne!(st["status"], "succeeded", "{name}");
        }
    }
}

#[test]
fn a_complete_final_checkpoint_survives_a_kill_between_done_and_exit() {
    let s = Scratch::new("done-then-killed");
    let plan = s.write(
        "plan.toml",
        "[[stage]]\nname = \"train\"\nkind = \"train\"\n[stage.params]\nsteps = 6\nbatch_size = 2\nseq_len = 16\nmodel = { d_model = 32, n_layers = 1, n_heads = 2, max_seq_len = 32 }\n",
    );
    let run_dir = s.path().join("run");
    let out = run_quiet(&plan, &run_dir, s.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let first = report(&run_dir)["stages"][0]["metrics"].clone();
    // What a kill -9 of orchestrate after the worker's `done` but before its exit leaves: the
    // complete checkpoint on disk, the journal with the attempt started and never finished.
    let journal_path = run_dir.join("journal.jsonl");
    let kept: Vec<String> = std::fs::read_to_string(&journal_path)
        .unwrap()
        .lines()
        .filter(|l| !l.contains("\"stage_finished\"") && !l.contains("\"run_finished\""))
        .map(str::to_string)
        .collect();
    std::fs::write(&journal_path, kept.join("\n") + "\n").unwrap();
    let resumed = orch(&["resume", run_dir.to_str().unwrap(), "-q"], s.path());
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    let log = std::fs::read_to_string(run_dir.join("stages/train/stderr.log")).unwrap();
    let second = &log[log.rfind("attempt 2").expect("a second attempt ran")..];
    assert!(second.contains("kept, not retrained"), "{second}");
    assert!(
        !second.contains("step 1/"),
        "no training step ran again: {second}"
    );
    let r = report(&run_dir);
    assert_eq!(r["stages"][0]["status"], "succeeded");
    for k in [
        "final_loss",
        "first_loss",
        "steps",
        "parameters",
        "tokens_per_s",
    ] {
        assert_eq!(
            r["stages"][0]["metrics"][k], first[k],
            "the same final metric {k} (the attempt's own timings aside)"
        );
    }
}

#[test]
fn a_run_dir_that_cannot_be_a_directory_is_a_bad_argument_that_says_what_is_there() {
    // Before: a file exited 4 ("exists and is not a directory"), a broken link 4 with "File
    // exists", while a non-empty directory exited 2.
    let s = Scratch::new("rundir-not-a-dir");
    let plan = s.write(
        "plan.toml",
        "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n",
    );
    s.write("file", "mine\n");
    std::os::unix::fs::symlink("nowhere", s.path().join("broken")).unwrap();
    std::os::unix::fs::symlink("file", s.path().join("to-file")).unwrap();
    for (dir, says) in [
        (
            "file",
            "file is a regular file, not a directory: --run-dir names the directory a run writes into; choose a new or empty directory",
        ),
        (
            "broken",
            "broken is a symbolic link to nowhere, which does not exist: create the directory it points to, or choose a new or empty directory",
        ),
        (
            "to-file",
            "to-file is a symbolic link to file, which is a regular file, not a directory",
        ),
        (
            "file/run",
            "file/run cannot be created: file is a file, not a directory",
        ),
    ] {
        let out = run_quiet(&plan, Path::new(dir), s.path());
        assert_eq!(out.status.code(), Some(2), "{dir}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("error: {says}")), "{dir}: {stderr}");
    }
    assert_eq!(
        std::fs::read_to_string(s.path().join("file")).unwrap(),
        "mine\n"
    );
    assert!(!s.path().join("nowhere").exists(), "nothing created");
    // A link to a directory is a directory.
    std::fs::create_dir(s.path().join("real")).unwrap();
    std::os::unix::fs::symlink("real", s.path().join("to-dir")).unwrap();
    let out = run_quiet(&plan, Path::new("to-dir"), s.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(s.path().join("real/journal.jsonl").is_file());
}
