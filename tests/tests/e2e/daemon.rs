//! `orchestrate daemon` for real: hostile and broken clients refused while stages run and
//! other clients are served; several runs at once sharing processes and GPUs (stand-in GPUs
//! on CPU machines); restart recovery; the Python client.

use e2e_tests::daemon::{run_python_check, Conn, Signal, TestDaemon};
use e2e_tests::{
    alive, journal_records as journal, orchestrate, processes_with_env, read_report, report_stage,
    stage_starts as starts, wait_for, Scratch,
};
use serde_json::{json, Value};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long the daemons here let a connection sit in the middle of a request: short, so that
/// a half-sent request is seen closed within the test.
const IDLE_TIMEOUT: &str = "2s";

/// A daemon on the scratch directory's `sock/d.sock` and `runs` (its log `daemon.log`), with
/// `env` added to its environment.
fn start(s: &Scratch, env: &[(&str, &str)]) -> TestDaemon {
    TestDaemon::start_in_with(s.path(), IDLE_TIMEOUT, &[], env)
}

#[test]
fn broken_and_hostile_clients_are_refused_while_a_stage_runs_and_others_are_served() {
    let s = Scratch::new("daemon-hostile");
    let d = start(&s, &[]);
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode");
    let marker = format!("hostile-{}", std::process::id());
    let mut main = d.connect();
    assert_eq!(main.hello["type"], "hello");
    assert_eq!(main.hello["v"], 1);
    let id = main.submit_toml(
        &format!(
            "[[stage]]\nname = \"work\"\ncommand = [\"sh\", \"-c\", \"(sleep 3; echo done > {{output}}/out) & wait\"]\noutputs = [\"out\"]\nenv = {{ MARKER = \"{marker}\" }}\n"
        ),
        s.path(),
    );
    assert!(wait_for(Duration::from_secs(10), || !processes_with_env(
        &format!("MARKER={marker}")
    )
    .is_empty()));

    // Each refusal names its problem; the connection goes on.
    let mut c = d.connect();
    let a = c.call(json!("not an object"));
    assert_eq!(a["code"], "malformed", "{a}");
    assert!(c.send_raw(b"{this is not json\n"));
    let a = c.read().unwrap();
    assert_eq!(a["code"], "malformed", "{a}");
    let a = c.call(json!({"v": 1, "type": "explode"}));
    assert_eq!(a["code"], "unknown_type", "{a}");
    assert!(a["error"].as_str().unwrap().contains("explode"));
    let a = c.call(json!({"v": 99, "type": "list"}));
    assert_eq!(a["code"], "version", "{a}");
    assert!(a["error"].as_str().unwrap().contains("99"));
    let a = c.call(json!({"v": 1, "type": "list"}));
    assert_eq!(a["type"], "runs", "still served after errors: {a}");
    let a = c.call(json!({"v": 1, "type": "status", "id": "nope"}));
    assert_eq!(a["code"], "not_found");

    // A 10 MB line: refused, connection closed.
    let mut big = d.connect();
    let line = format!(
        "{{\"v\":1,\"type\":\"submit\",\"plan\":{{\"toml\":\"{}\"}}}}\n",
        "x".repeat(10 << 20)
    );
    let writer = big.writer();
    let sender = std::thread::spawn(move || {
        let mut w = writer;
        let _ = w.write_all(line.as_bytes());
    });
    let a = big.read().expect("an answer before closing");
    assert_eq!(a["code"], "too_large", "{a}");
    assert!(big.read().is_none(), "closed after an over-long line");
    let _ = sender.join();

    // Half a line, then silence: closed after the idle timeout (2 s here).
    let mut half = d.connect();
    assert!(half.send_raw(b"{\"v\":1,\"ty"));
    let t = Instant::now();
    let a = half.read().expect("told why");
    assert!(
        a["error"].as_str().unwrap().contains("no complete request"),
        "{a}"
    );
    assert!(half.read().is_none());
    assert!(t.elapsed() < Duration::from_secs(10));

    // 500 connections at once, all served.
    let mut many: Vec<Conn> = (0..500).map(|_| d.connect()).collect();
    for conn in &mut many {
        assert!(conn.send_raw(b"{\"v\":1,\"type\":\"list\"}\n"));
    }
    for conn in &mut many {
        assert_eq!(conn.read().unwrap()["type"], "runs");
    }
    drop(many);

    // Another user: the socket's mode keeps it out; with the mode opened by mistake, the
    // daemon itself refuses it by its credentials.
    let as_nobody = |socket: &Path| {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(orchestrate())
            .args(["runs", "--socket"])
            .arg(socket)
            .output()
            .expect("setpriv (util-linux) runs");
        assert_eq!(out.status.code(), Some(4));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // (the binary must be reachable by that user)
    let mut ancestors = orchestrate();
    while let Some(p) = ancestors.parent() {
        let m = std::fs::metadata(p).unwrap().permissions().mode();
        if m & 0o001 == 0 {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m | 0o001)).unwrap();
        }
        ancestors = p.to_path_buf();
    }
    let first = as_nobody(&d.socket);
    assert!(first.contains("Permission denied"), "{first}");
    std::fs::set_permissions(
        d.socket.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut ancestors = s.path().to_path_buf();
    while let Some(p) = ancestors.parent() {
        let m = std::fs::metadata(p).unwrap().permissions().mode();
        if m & 0o001 == 0 {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m | 0o001)).unwrap();
        }
        ancestors = p.to_path_buf();
    }
    let m = std::fs::metadata(s.path()).unwrap().permissions().mode();
    std::fs::set_permissions(s.path(), std::fs::Permissions::from_mode(m | 0o005)).unwrap();
    let second = as_nobody(&d.socket);
    assert!(
        second.contains("refused the connection: permission denied: uid 65534"),
        "refused by SO_PEERCRED: {second}"
    );

    // The stage that ran through all of it finished unharmed. (`main` sat idle past the idle
    // timeout meanwhile: it was closed, as idle connections are.)
    assert!(main.read().is_some_and(|a| a["error"]
        .as_str()
        .unwrap_or("")
        .contains("no complete request")));
    let run = d.connect().wait(&id);
    assert_eq!(run["state"], "succeeded", "{run}");
    let dir = PathBuf::from(run["run_dir"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(dir.join("stages/work/output/out")).unwrap(),
        "done\n"
    );
    assert!(processes_with_env(&format!("MARKER={marker}")).is_empty());
}

#[test]
fn two_runs_at_once_with_grandchildren_both_finish_and_leave_nothing() {
    let s = Scratch::new("daemon-two");
    let d = start(&s, &[]);
    let marker = format!("two-{}", std::process::id());
    let plan = |secs: &str| {
        format!(
            "[[stage]]\nname = \"fan\"\ncommand = [\"sh\", \"-c\", \"(sleep {secs}; echo a > {{output}}/a) & (setsid sh -c 'sleep {secs}; echo b > {{output}}/b') & sleep {secs}; sleep 0.3; test -f {{output}}/a\"]\noutputs = [\"a\"]\nenv = {{ MARKER = \"{marker}\" }}\n[[stage]]\nname = \"after\"\nafter = [\"fan\"]\ncommand = [\"sh\", \"-c\", \"cat {{input.fan}}/a > {{output}}/copy\"]\noutputs = [\"copy\"]\n"
        )
    };
    let mut c = d.connect();
    let short = c.submit_toml(&plan("0.5"), s.path());
    let long = c.submit_toml(&plan("2"), s.path());
    let t = Instant::now();
    let a = c.wait(&short);
    let b = c.wait(&long);
    assert_eq!(a["state"], "succeeded", "{a}");
    assert_eq!(b["state"], "succeeded", "{b}");
    assert!(t.elapsed() < Duration::from_secs(30), "neither hangs");
    for run in [&a, &b] {
        let dir = PathBuf::from(run["run_dir"].as_str().unwrap());
        assert_eq!(
            std::fs::read_to_string(dir.join("stages/after/output/copy")).unwrap(),
            "a\n"
        );
    }
    // They overlapped in time: the long run's first stage started before the short run ended.
    let started = |run: &Value| -> f64 {
        let dir = PathBuf::from(run["run_dir"].as_str().unwrap());
        journal(&dir)
            .iter()
            .find(|r| r["rec"] == "stage_started")
            .unwrap()["t"]
            .as_f64()
            .unwrap()
    };
    let finished = |run: &Value| -> f64 {
        let dir = PathBuf::from(run["run_dir"].as_str().unwrap());
        journal(&dir)
            .iter()
            .rev()
            .find(|r| r["rec"] == "run_finished")
            .unwrap()["t"]
            .as_f64()
            .unwrap()
    };
    assert!(started(&b) < finished(&a), "the runs ran at the same time");
    assert!(wait_for(Duration::from_secs(5), || processes_with_env(
        &format!("MARKER={marker}")
    )
    .is_empty()));
}

/// Notes the stage's event socket, waits a moment (so that both runs' stages are up), then
/// sends `{"run": K}` as metrics on it.
const TALK: &str = "import json, os, socket, sys, time\nopen(os.path.join(os.environ['ORCHESTRATE_OUTPUT_DIR'], 'socket'), 'w').write(os.environ['ORCHESTRATE_EVENTS'])\ntime.sleep(1.0)\nc = socket.socket(socket.AF_UNIX)\nc.connect(os.environ['ORCHESTRATE_EVENTS'])\nc.sendall((json.dumps({'v': 1, 'event': 'metrics', 'metrics': {'run': int(sys.argv[1])}}) + '\\n').encode())\nc.close()\n";

#[test]
fn the_same_stage_of_two_runs_at_once_gets_its_own_event_socket() {
    let s = Scratch::new("daemon-sockets");
    let talk = s.write("talk.py", TALK);
    let d = start(&s, &[]);
    let plan = |k: u32| {
        format!(
            "[[stage]]\nname = \"talk\"\ncommand = [\"python3\", \"{}\", \"{k}\"]\n",
            talk.display()
        )
    };
    let mut c = d.connect();
    let first = c.submit_toml(&plan(1), s.path());
    let second = c.submit_toml(&plan(2), s.path());
    let mut sockets = Vec::new();
    for (id, k) in [(&first, 1.0), (&second, 2.0)] {
        let run = c.wait(id);
        assert_eq!(run["state"], "succeeded", "{run}");
        let dir = PathBuf::from(run["run_dir"].as_str().unwrap());
        let report = read_report(&dir);
        let stage = report_stage(&report, "talk");
        assert_eq!(
            stage["metrics"]["run"].as_f64(),
            Some(k),
            "each run's stage reports on its own socket: {stage}"
        );
        sockets.push(std::fs::read_to_string(dir.join("stages/talk/output/socket")).unwrap());
    }
    assert_ne!(sockets[0], sockets[1], "stage 0 of two runs: two sockets");
}

fn gpu_plan(name: &str, record: &Path, secs: &str) -> String {
    format!(
        "[[stage]]\nname = \"{name}\"\ngpus = 1\ncommand = [\"sh\", \"-c\", \"echo start $(date +%s.%N) $ORCHESTRATE_GPU_UUIDS >> {r}; sleep {secs}; echo end $(date +%s.%N) $ORCHESTRATE_GPU_UUIDS >> {r}\"]\n",
        r = record.display()
    )
}

#[test]
fn two_runs_on_one_gpu_take_it_in_turn() {
    let s = Scratch::new("daemon-one-gpu");
    let d = start(&s, &[("ORCHESTRATE_FAKE_GPUS", "1")]);
    let rec_a = s.path().join("a.txt");
    let rec_b = s.path().join("b.txt");
    let mut c = d.connect();
    let a = c.submit_toml(&gpu_plan("a", &rec_a, "1"), s.path());
    let b = c.submit_toml(&gpu_plan("b", &rec_b, "1"), s.path());
    assert_eq!(c.wait(&a)["state"], "succeeded");
    assert_eq!(c.wait(&b)["state"], "succeeded");
    let span = |p: &Path| -> (f64, f64, String) {
        let text = std::fs::read_to_string(p).unwrap();
        let mut lines = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>());
        let start = lines.next().unwrap();
        let end = lines.next().unwrap();
        (
            start[1].parse().unwrap(),
            end[1].parse().unwrap(),
            start[2].to_string(),
        )
    };
    let (a0, a1, ga) = span(&rec_a);
    let (b0, b1, gb) = span(&rec_b);
    assert_eq!(ga, "GPU-fake-0");
    assert_eq!(gb, "GPU-fake-0");
    assert!(
        a1 <= b0 || b1 <= a0,
        "one stage on the GPU at a time: a {a0}..{a1}, b {b0}..{b1}"
    );
}

#[test]
fn a_gpu_held_by_a_foreign_process_is_not_assigned_and_the_wait_names_the_holder() {
    let s = Scratch::new("daemon-foreign");
    let holders = s.path().join("holders");
    std::fs::create_dir_all(&holders).unwrap();
    std::fs::write(holders.join("GPU-fake-0"), "4242 python3 22548578304\n").unwrap();
    let d = start(
        &s,
        &[
            ("ORCHESTRATE_FAKE_GPUS", "2"),
            ("ORCHESTRATE_FAKE_GPU_DIR", holders.to_str().unwrap()),
        ],
    );
    let rec_a = s.path().join("a.txt");
    let rec_b = s.path().join("b.txt");
    let mut c = d.connect();
    let a = c.submit_toml(&gpu_plan("a", &rec_a, "3"), s.path());
    assert!(wait_for(Duration::from_secs(10), || rec_a.exists()));
    let b = c.submit_toml(&gpu_plan("b", &rec_b, "0.2"), s.path());
    // b waits: GPU 1 busy with a, GPU 0 held by a process that is not ours.
    let mut reason = String::new();
    assert!(
        wait_for(Duration::from_secs(10), || {
            let st = c.call(json!({"v": 1, "type": "status", "id": b}));
            reason = st["runs"][0]["waiting"].to_string();
            reason.contains("pid 4242 (python3)")
        }),
        "the waiting reason names the holder: {reason}"
    );
    assert!(!rec_b.exists(), "b did not start on the held GPU");
    assert_eq!(c.wait(&a)["state"], "succeeded");
    assert_eq!(c.wait(&b)["state"], "succeeded");
    let gpu_of = |p: &Path| {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .nth(2)
            .unwrap()
            .to_string()
    };
    assert_eq!(gpu_of(&rec_a), "GPU-fake-1");
    assert_eq!(
        gpu_of(&rec_b),
        "GPU-fake-1",
        "b waited for our GPU rather than take the held one"
    );
    // Once the foreign process is gone, the GPU is used again.
    std::fs::remove_file(holders.join("GPU-fake-0")).unwrap();
    let rec_c = s.path().join("c.txt");
    let rec_e = s.path().join("e.txt");
    let c1 = c.submit_toml(&gpu_plan("c", &rec_c, "1"), s.path());
    let e1 = c.submit_toml(&gpu_plan("e", &rec_e, "1"), s.path());
    assert_eq!(c.wait(&c1)["state"], "succeeded");
    assert_eq!(c.wait(&e1)["state"], "succeeded");
    let mut used = vec![gpu_of(&rec_c), gpu_of(&rec_e)];
    used.sort();
    assert_eq!(used, ["GPU-fake-0", "GPU-fake-1"], "both GPUs in parallel");
}

#[test]
fn the_daemon_recovers_its_runs_after_being_killed() {
    let s = Scratch::new("daemon-restart");
    let mut d = start(&s, &[]);
    let marker = format!("restart-{}", std::process::id());
    let flag = s.path().join("second-time");
    let mut c = d.connect();
    let done = c.submit_toml(
        "[[stage]]\nname = \"quick\"\ncommand = [\"true\"]\n",
        s.path(),
    );
    assert_eq!(c.wait(&done)["state"], "succeeded");
    let id = c.submit_toml(
        &format!(
            "[[stage]]\nname = \"first\"\ncommand = [\"sh\", \"-c\", \"echo 1 > {{output}}/x\"]\noutputs = [\"x\"]\n[[stage]]\nname = \"second\"\nafter = [\"first\"]\ncommand = [\"sh\", \"-c\", \"if [ -f {f} ]; then echo ok > {{output}}/y; else touch {f}; sleep 60; fi\"]\noutputs = [\"y\"]\nenv = {{ MARKER = \"{marker}\" }}\n",
            f = flag.display()
        ),
        s.path(),
    );
    assert!(wait_for(Duration::from_secs(10), || flag.exists()));
    let run_dir = d.runs.join(&id);
    // The start is journaled just after the spawn (it needs the PID) and need not be durable
    // before the stage runs: kill once it is in the journal, so that the count below is exact.
    assert!(wait_for(Duration::from_secs(10), || starts(
        &run_dir, "second"
    ) == 1));
    d.stop_with(Signal::SIGKILL);
    assert!(
        wait_for(Duration::from_secs(5), || processes_with_env(&format!(
            "MARKER={marker}"
        ))
        .is_empty()),
        "the daemon's stages died with it"
    );
    let socket = d.socket.clone();
    let runs = d.runs.clone();
    drop(d);
    let d = TestDaemon::start_with(
        &socket,
        &runs,
        &s.path().join("daemon-restarted.log"),
        IDLE_TIMEOUT,
        &[],
    );
    let mut c = d.connect();
    let run = c.wait(&id);
    assert_eq!(run["state"], "succeeded", "{run}");
    assert_eq!(
        starts(&run_dir, "first"),
        1,
        "the finished stage is not rerun"
    );
    assert_eq!(
        starts(&run_dir, "second"),
        2,
        "the interrupted stage ran again"
    );
    let listed = c.call(json!({"v": 1, "type": "list"}));
    let ids: Vec<&str> = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&done.as_str()) && ids.contains(&id.as_str()),
        "history survives: {ids:?}"
    );
    // Events from before the restart are still there to watch.
    let mut w = d.connect();
    assert!(w.send_raw(format!("{{\"v\":1,\"type\":\"watch\",\"id\":\"{done}\"}}\n").as_bytes()));
    let mut seqs = Vec::new();
    loop {
        let a = w.read().unwrap();
        if a["type"] == "finished" {
            break;
        }
        seqs.push(a["seq"].as_u64().unwrap());
    }
    assert!(!seqs.is_empty());
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
}

#[test]
fn the_cli_client_and_the_python_client_drive_the_daemon() {
    let s = Scratch::new("daemon-clients");
    let d = start(&s, &[]);
    let plan = s.write("plan.toml", "[[stage]]\nname = \"a\"\ncommand = [\"sh\", \"-c\", \"echo hi\"]\n[[stage]]\nname = \"b\"\nafter = [\"a\"]\ncommand = [\"false\"]\n");
    let out = Command::new(orchestrate())
        .args(["submit", "--watch", "--socket"])
        .arg(&d.socket)
        .arg(&plan)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "the run's own status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("a: succeeded"));
    let out = Command::new(orchestrate())
        .args(["runs", "--json", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs["runs"][0]["state"], "failed");
    run_python_check("client_check.py", &d.socket, s.path());
    // A second daemon on the same socket is refused; shutdown stops the first.
    let second = Command::new(orchestrate())
        .args(["daemon", "--socket"])
        .arg(&d.socket)
        .arg("--runs-dir")
        .arg(s.path().join("runs2"))
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&second.stderr).contains("already"));
    let pid = d.pid();
    let out = Command::new(orchestrate())
        .args(["shutdown", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(wait_for(Duration::from_secs(10), || !alive(pid)));
    assert!(!d.socket.exists(), "the socket is removed on shutdown");
}

#[test]
fn a_higher_priority_run_gets_the_gpu_first_and_equal_ones_keep_submission_order() {
    let s = Scratch::new("daemon-priority");
    let d = start(&s, &[("ORCHESTRATE_FAKE_GPUS", "1")]);
    let rec = |n: &str| s.path().join(format!("{n}.txt"));
    let mut c = d.connect();
    let submit = |c: &mut Conn, name: &str, priority: i32| -> String {
        // The first run holds the GPU long enough for the others to queue behind it.
        let secs = if name == "first" { "2" } else { "0.3" };
        let answer = c.call(json!({
            "v": 1, "type": "submit", "priority": priority, "base_dir": s.path(),
            "plan": {"toml": gpu_plan(name, &rec(name), secs)},
        }));
        assert_eq!(answer["type"], "submitted", "{answer}");
        answer["id"].as_str().unwrap().to_string()
    };
    let first = submit(&mut c, "first", 0);
    assert!(wait_for(Duration::from_secs(10), || rec("first").exists()));
    let low1 = submit(&mut c, "low1", 0);
    let low2 = submit(&mut c, "low2", 0);
    let high = submit(&mut c, "high", 5);
    for id in [&first, &low1, &low2, &high] {
        assert_eq!(c.wait(id)["state"], "succeeded");
    }
    let start = |n: &str| -> f64 {
        std::fs::read_to_string(rec(n))
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(
        start("high") < start("low1"),
        "priority 5 went before the earlier priority-0 runs"
    );
    assert!(
        start("low1") < start("low2"),
        "equal priorities in submission order"
    );
}

/// `orchestrate runs` pads its state column whatever the states (issue 49): the stage counts
/// of a succeeded, a failed and an interrupted run start at one column.
#[test]
fn runs_lines_up_every_state() {
    let s = Scratch::new("daemon-runs-table");
    let d = TestDaemon::start_in(s.path(), "daemon.log");
    let mut c = d.connect();
    let plan = |name: &str, cmd: &str| {
        format!("[run]\nname = \"{name}\"\n[[stage]]\nname = \"s\"\ncommand = [\"sh\", \"-c\", \"{cmd}\"]\n")
    };
    let ok = c.submit_toml(&plan("ok", "true"), s.path());
    assert_eq!(c.wait(&ok)["state"], "succeeded");
    let bad = c.submit_toml(&plan("bad", "exit 1"), s.path());
    assert_eq!(c.wait(&bad)["state"], "failed");
    let slow = c.submit_toml(&plan("slow", "sleep 30"), s.path());
    let answer = c.call(json!({"v": 1, "type": "cancel", "id": slow}));
    assert_eq!(answer["type"], "cancelling", "{answer}");
    assert_eq!(c.wait(&slow)["state"], "interrupted");
    let out = Command::new(orchestrate())
        .args(["runs", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let header = table.lines().next().expect("a header");
    let stages_end = header.find("stages").expect("a stages column") + "stages".len();
    for id in [&ok, &bad, &slow] {
        let row = table
            .lines()
            .find(|l| l.starts_with(id.as_str()))
            .unwrap_or_else(|| panic!("{id} in\n{table}"));
        let slash = row.find('/').unwrap_or_else(|| panic!("{row}"));
        assert_eq!(slash, stages_end - 5, "the counts line up:\n{table}");
    }
}
