//! `orchestrate logs`: a run's stage logs, printed and followed until the run ends, for a run
//! directory and for a daemon run by its id.

use e2e_tests::daemon::TestDaemon;
use e2e_tests::{orchestrate, wait_for, Scratch};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

/// A two-stage plan: `slow` prints a line, waits for `go` to exist in the scratch directory,
/// prints another; then `second` prints one.
fn plan(s: &Scratch) -> String {
    let go = s.path().join("go");
    format!(
        r#"
[[stage]]
name = "slow"
command = ["sh", "-c", "echo first line; while [ ! -e {go} ]; do sleep 0.05; done; echo after go; echo to stderr >&2"]

[[stage]]
name = "second"
after = ["slow"]
command = ["sh", "-c", "echo from second"]
"#,
        go = go.display()
    )
}

/// `orchestrate logs ARGS…` started, its stdout lines arriving on the receiver.
fn follow(args: &[&str], socket: &Path) -> (Child, Receiver<String>) {
    let mut child = Command::new(orchestrate())
        .arg("logs")
        .args(args)
        .arg("--socket")
        .arg(socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// The next line within 20 s.
fn next(rx: &Receiver<String>) -> String {
    rx.recv_timeout(Duration::from_secs(20))
        .expect("a line within 20 s")
}

/// Follows a run through `target` (its directory or id): the first line while the stage waits,
/// the rest once it goes on, the later stage's too, and then `logs -f` ends with the run.
fn follow_to_the_end(s: &Scratch, target: &str, socket: &Path) {
    let (mut logs, lines) = follow(&[target, "-f"], socket);
    assert_eq!(next(&lines), "[slow] first line");
    // Nothing more while the stage waits: following, not finished.
    assert!(lines.recv_timeout(Duration::from_millis(500)).is_err());
    assert!(logs.try_wait().unwrap().is_none(), "still following");
    std::fs::write(s.path().join("go"), "").unwrap();
    assert_eq!(next(&lines), "[slow] after go");
    assert_eq!(next(&lines), "[slow] to stderr");
    assert_eq!(next(&lines), "[second] from second");
    assert!(
        wait_for(Duration::from_secs(20), || logs
            .try_wait()
            .unwrap()
            .is_some()),
        "logs -f ends when the run ends"
    );
    assert!(logs.wait().unwrap().success());
}

#[test]
fn logs_follow_a_run_directory_until_the_run_ends_and_one_stage_prints_unprefixed() {
    let s = Scratch::new("logs-dir");
    let plan_path = s.write("plan.toml", &plan(&s));
    let run_dir = s.path().join("run");
    let mut run = Command::new(orchestrate())
        .arg("--plan")
        .arg(&plan_path)
        .arg("--run-dir")
        .arg(&run_dir)
        .arg("-q")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(20), || run_dir
        .join("stages/slow/stdout.log")
        .exists()));
    let nowhere = s.path().join("no-daemon.sock");
    follow_to_the_end(&s, run_dir.to_str().unwrap(), &nowhere);
    assert!(run.wait().unwrap().success());

    // One stage: its lines as written, stdout then stderr, no prefix; the header line of the
    // attempt is part of the log.
    let (mut one, lines) = follow(&[run_dir.to_str().unwrap(), "second"], &nowhere);
    let got: Vec<String> = lines.iter().collect();
    assert!(one.wait().unwrap().success());
    assert!(got.contains(&"from second".to_string()), "{got:?}");
    assert!(got.iter().all(|l| !l.starts_with("[second]")), "{got:?}");

    // A stage that never ran, and a run that is not there, are wrong arguments.
    let status = |args: &[&str]| {
        Command::new(orchestrate())
            .arg("logs")
            .args(args)
            .arg("--socket")
            .arg(&nowhere)
            .output()
            .unwrap()
    };
    let missing = status(&[run_dir.to_str().unwrap(), "nope"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("stage nope has no logs"));
    let no_run = status(&["no-such-run"]);
    assert_eq!(no_run.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&no_run.stderr).contains("is not a run directory"),
        "{}",
        String::from_utf8_lossy(&no_run.stderr)
    );
}

#[test]
fn logs_follow_a_daemon_run_by_its_id() {
    let s = Scratch::new("logs-daemon");
    let d = TestDaemon::start_in(s.path(), "daemon.log");
    let mut conn = d.connect();
    let id = conn.submit_toml(&plan(&s), s.path());
    follow_to_the_end(&s, &id, &d.socket);
    let run = conn.wait(&id);
    assert_eq!(run["state"], "succeeded", "{run}");
}
