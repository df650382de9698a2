//! A daemon restart tells the truth (issue 30, items 7, 8, 10, 11): the daemon owns its runs
//! directory; a restart after SIGTERM or `shutdown --cancel` resumes the runs that stop
//! stopped, as one after `kill -9` does, while a run a user cancelled stays cancelled;
//! finished runs keep their counts and end time; run ids stay unique.

use e2e_tests::daemon::{Conn, Signal, TestDaemon};
use e2e_tests::{orchestrate, stage_starts as starts, wait_for, Scratch};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A plan whose first stage writes an output at once and whose second sleeps 60 s the first
/// time (after creating `flag`) and succeeds at once the next.
fn interruptible_plan(flag: &Path) -> String {
    format!(
        "[[stage]]\nname = \"first\"\ncommand = [\"sh\", \"-c\", \"echo 1 > {{output}}/x\"]\noutputs = [\"x\"]\n\
         [[stage]]\nname = \"second\"\nafter = [\"first\"]\ncommand = [\"sh\", \"-c\", \"if [ -f {f} ]; then echo ok > {{output}}/y; else touch {f}; exec sleep 60; fi\"]\noutputs = [\"y\"]\n",
        f = flag.display()
    )
}

/// Submits [`interruptible_plan`] and returns once its second stage runs and is journaled.
fn submit_interruptible(s: &Scratch, d: &TestDaemon) -> (String, PathBuf) {
    let flag = s.path().join("second-ran");
    let id = d
        .connect()
        .submit_toml(&interruptible_plan(&flag), s.path());
    let run_dir = d.runs.join(&id);
    assert!(wait_for(Duration::from_secs(20), || flag.exists()));
    assert!(wait_for(Duration::from_secs(10), || starts(
        &run_dir, "second"
    ) == 1));
    (id, run_dir)
}

fn find<'a>(runs: &'a [Value], id: &str) -> &'a Value {
    runs.iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("run {id} is not listed: {runs:?}"))
}

/// Stops the daemon with `stop` while a run's second stage runs, restarts it, and checks the
/// run is resumed to success exactly as after a `kill -9`.
fn a_stopped_run_resumes_after_a_restart(name: &str, stop: impl FnOnce(&mut TestDaemon)) {
    let s = Scratch::new(name);
    let mut d = TestDaemon::start_in(&s, "first.log");
    let (id, run_dir) = submit_interruptible(&s, &d);
    // A client waiting on the run while the daemon stops is told it will resume, not that it
    // ended.
    let socket = d.socket.clone();
    let waiter_id = id.clone();
    let waiter = std::thread::spawn(move || {
        let mut c = Conn::try_open(&socket).expect("connect");
        c.wait_answer(&waiter_id)
    });
    std::thread::sleep(Duration::from_millis(200));
    stop(&mut d);
    let told = waiter.join().unwrap();
    assert_eq!(told["type"], "error", "{told}");
    assert_eq!(told["code"], "shutting_down", "{told}");
    assert!(
        told["error"].as_str().unwrap().contains("resumes"),
        "{told}"
    );
    drop(d);

    let d = TestDaemon::start_in(&s, "second.log");
    let mut c = d.connect();
    let run = c.wait(&id);
    assert_eq!(run["state"], "succeeded", "{run}\n{}", d.log());
    assert_eq!(run["exit_code"], 0);
    assert_eq!(starts(&run_dir, "first"), 1, "the finished stage is kept");
    assert_eq!(starts(&run_dir, "second"), 2, "the stopped stage ran again");
    assert_eq!(
        run["succeeded"], 2,
        "the kept stage counts with the one that ran again: {run}"
    );
    assert!(
        !run_dir.join("stopped-by-daemon").exists(),
        "the mark is gone once the run is resumed"
    );
}

#[test]
fn a_run_stopped_by_sigterm_to_the_daemon_resumes_when_it_starts_again() {
    a_stopped_run_resumes_after_a_restart("restart-sigterm", |d| {
        let status = d.stop_with(Signal::SIGTERM);
        assert!(status.success(), "the daemon stops cleanly: {status:?}");
    });
}

#[test]
fn a_run_stopped_by_shutdown_cancel_resumes_when_the_daemon_starts_again() {
    a_stopped_run_resumes_after_a_restart("restart-shutdown-cancel", |d| {
        let out = Command::new(orchestrate())
            .args(["shutdown", "--cancel", "--socket"])
            .arg(&d.socket)
            .output()
            .unwrap();
        assert!(out.status.success());
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains("stopping its 1 unfinished run(s)") && said.contains("resume"),
            "{said}"
        );
        assert!(d.wait_exit().success());
    });
}

#[test]
fn a_run_a_user_cancelled_stays_interrupted_after_a_restart_and_cannot_be_cancelled_again() {
    let s = Scratch::new("restart-user-cancel");
    let mut d = TestDaemon::start_in(&s, "first.log");
    let (id, run_dir) = submit_interruptible(&s, &d);
    let mut c = d.connect();
    let answer = c.call(json!({"v": 1, "type": "cancel", "id": id}));
    assert_eq!(answer["type"], "cancelling", "{answer}");
    assert_eq!(c.wait(&id)["state"], "interrupted");
    // A cancel of a run that has ended says so, and the CLI fails.
    let again = c.call(json!({"v": 1, "type": "cancel", "id": id}));
    assert_eq!(again["code"], "already_finished", "{again}");
    assert!(again["error"]
        .as_str()
        .unwrap()
        .contains("already finished"));
    let out = Command::new(orchestrate())
        .args(["cancel", &id, "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already finished"));
    assert!(d.stop_with(Signal::SIGTERM).success());
    drop(d);

    let d = TestDaemon::start_in(&s, "second.log");
    let runs = d.connect().list();
    assert_eq!(find(&runs, &id)["state"], "interrupted", "{runs:?}");
    assert_eq!(find(&runs, &id)["exit_code"], 130);
    assert_eq!(starts(&run_dir, "second"), 1, "not resumed");
}

#[test]
fn a_second_daemon_on_the_same_runs_directory_is_refused_and_names_the_holder() {
    let s = Scratch::new("runs-dir-owner");
    let d = TestDaemon::start_in(&s, "first.log");
    // Another socket, and another path to the same runs directory.
    let alias = s.path().join("runs-alias");
    std::os::unix::fs::symlink(&d.runs, &alias).unwrap();
    let mut second = TestDaemon::command(&s.path().join("sock2/d.sock"), &alias)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ended = wait_for(Duration::from_secs(20), || {
        matches!(second.try_wait(), Ok(Some(_)))
    });
    if !ended {
        let _ = second.kill();
        let _ = second.wait();
        panic!("a second daemon started on a runs directory another daemon owns");
    }
    let out = second.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(4));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("already owned by another daemon"), "{said}");
    assert!(said.contains(&format!("pid {}", d.pid())), "{said}");
    // The first daemon is untouched.
    assert!(d.connect().list().is_empty());
}

#[test]
fn a_restarted_daemon_lists_finished_runs_as_they_ended() {
    let s = Scratch::new("restart-history");
    let mut d = TestDaemon::start_in(&s, "first.log");
    let mut c = d.connect();
    let id = c.submit_toml(
        "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n[[stage]]\nname = \"b\"\nafter = [\"a\"]\ncommand = [\"true\"]\n",
        s.path(),
    );
    let before = c.wait(&id);
    assert_eq!(before["succeeded"], 2, "{before}");
    drop(c);
    d.stop_with(Signal::SIGKILL);
    drop(d);
    std::thread::sleep(Duration::from_millis(1100));
    let d = TestDaemon::start_in(&s, "second.log");
    let runs = d.connect().list();
    let after = find(&runs, &id);
    assert_eq!(after["state"], "succeeded");
    assert_eq!(after["succeeded"], 2, "{after}");
    let (t0, t1) = (
        before["finished_unix"].as_f64().unwrap(),
        after["finished_unix"].as_f64().unwrap(),
    );
    assert!(
        (t0 - t1).abs() < 0.5,
        "the end time is the run's, not the restart's: {t0} then {t1}"
    );
    // `watch` of it ends with the same summary.
    let mut w = d.connect();
    w.send_raw(format!("{{\"v\":1,\"type\":\"watch\",\"id\":\"{id}\"}}\n").as_bytes());
    let finished = loop {
        let a = w.read().expect("the watch ends with `finished`");
        if a["type"] == "finished" {
            break a;
        }
    };
    assert_eq!(finished["run"]["succeeded"], 2, "{finished}");
}

#[test]
fn run_ids_stay_unique_for_copied_directories_and_a_moved_runs_directory() {
    let s = Scratch::new("run-ids");
    let mut d = TestDaemon::start_in(&s, "first.log");
    let quick = "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n";
    let mut c = d.connect();
    let id = c.submit_toml(quick, s.path());
    c.wait(&id);
    drop(c);
    assert!(d.stop_with(Signal::SIGTERM).success());
    drop(d);
    let copy = format!("{id}-copy");
    let status = Command::new("cp")
        .arg("-a")
        .arg(s.path().join("runs").join(&id))
        .arg(s.path().join("runs").join(&copy))
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::create_dir(s.path().join("runs/not-a-run")).unwrap();
    std::fs::create_dir(s.path().join("runs/bad-submission")).unwrap();
    std::fs::write(s.path().join("runs/bad-submission/submission.json"), "{").unwrap();

    let d = TestDaemon::start_in(&s, "second.log");
    let mut c = d.connect();
    let runs = c.list();
    let mut ids: Vec<&str> = runs.iter().map(|r| r["id"].as_str().unwrap()).collect();
    ids.sort();
    let mut want = vec![id.as_str(), copy.as_str()];
    want.sort();
    assert_eq!(ids, want, "each directory is one run, under its own name");
    let log = d.log();
    assert!(
        log.contains("not-a-run") && log.contains("bad-submission") && log.contains("not a run"),
        "directories that are not runs are reported:\n{log}"
    );
    assert!(log.contains(&copy), "the copy's id is explained:\n{log}");

    // A runs directory moved away while the daemon runs: a submission in the same second as
    // one before the move still gets an id of its own.
    for _ in 0..5 {
        let before = c.submit_toml(quick, s.path());
        c.wait(&before);
        let moved = s.path().join(format!("runs-moved-{before}"));
        std::fs::rename(s.path().join("runs"), &moved).unwrap();
        let after = c.submit_toml(quick, s.path());
        c.wait(&after);
        assert_ne!(before, after, "one id for two runs");
        let listed = c.list();
        let same: Vec<&Value> = listed.iter().filter(|r| r["id"] == after).collect();
        assert_eq!(same.len(), 1, "{listed:?}");
        // Only a submission within the same second tests the point; try again otherwise.
        let second = |id: &str| id.split('-').take(3).collect::<Vec<_>>().join("-");
        if second(&after) == second(&before) {
            return;
        }
    }
    panic!("no two submissions fell in one second in five tries");
}
