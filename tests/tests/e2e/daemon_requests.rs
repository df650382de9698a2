//! What the daemon takes from clients (issue 30, items 12, 13, 16): its memory for unfinished
//! requests is bounded for all connections together; a request naming a key twice, or a
//! version that is not a number, is refused with an answer that says so; the Python client
//! survives a `watch` left early.

use e2e_tests::daemon::{run_python_check, TestDaemon};
use e2e_tests::Scratch;
use serde_json::json;
use std::time::Duration;

#[test]
fn unfinished_requests_of_many_connections_together_are_bounded() {
    let s = Scratch::new("request-budget");
    // Held connections must not be closed as idle while the next ones fill the budget.
    let d = TestDaemon::start_in_with(s.path(), "120s", &[], &[]);
    // Each line is under the 8 MiB cap of one line; twelve of them are far over the 64 MiB
    // the daemon holds for all connections.
    let partial = vec![b' '; 6 << 20];
    let mut held = Vec::new();
    let mut refused = None;
    for i in 0..12 {
        let mut c = d.connect();
        let sent = c.send_raw(b"{\"v\":1,\"type\":\"list\",\"pad\":\"") && c.send_raw(&partial);
        // A connection the daemon holds answers nothing yet; a refused one has its error.
        match c.read_within(Duration::from_secs(1)) {
            Some(answer) => {
                refused = Some((i, answer));
                break;
            }
            None if !sent => panic!("connection {i} was closed without an answer"),
            None => held.push(c),
        }
    }
    let (at, refused) = refused.expect("a connection over the daemon's total budget is refused");
    assert!(at >= 4, "the first connections are held: refused at {at}");
    assert_eq!(refused["code"], "too_large", "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("all connections together"),
        "{refused}"
    );
    // Once they are gone, the daemon serves as before.
    drop(held);
    let mut c = d.connect();
    assert_eq!(c.call(json!({"v": 1, "type": "list"}))["type"], "runs");
    let rss_kib: u64 = std::fs::read_to_string(format!("/proc/{}/status", d.pid()))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap();
    assert!(
        rss_kib < 400 << 10,
        "the daemon's peak memory stayed bounded: {rss_kib} KiB"
    );
}

#[test]
fn a_request_naming_a_key_twice_or_a_version_as_text_is_refused_with_what_is_wrong() {
    let s = Scratch::new("request-keys");
    let d = TestDaemon::start_in(&s, "daemon.log");
    let mut c = d.connect();
    c.send_raw(b"{\"v\":1,\"type\":\"list\",\"type\":\"shutdown\"}\n");
    let answer = c.read().unwrap();
    assert_eq!(answer["code"], "malformed", "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("duplicate key \"type\""),
        "{answer}"
    );
    // Not shut down: it takes a submit.
    let id = c.submit_toml("[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n", s.path());
    assert_eq!(c.wait(&id)["state"], "succeeded");
    // Deeper down too: two values for one variable of an inline JSON plan.
    c.send_raw(
        b"{\"v\":1,\"type\":\"submit\",\"plan\":{\"json\":{\"stage\":[{\"name\":\"a\",\"command\":[\"true\"],\"env\":{\"A\":\"1\",\"A\":\"2\"}}]}}}\n",
    );
    let answer = c.read().unwrap();
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("duplicate key \"A\""),
        "{answer}"
    );
    c.send_raw(b"{\"v\":\"1\",\"type\":\"list\"}\n");
    let answer = c.read().unwrap();
    assert_eq!(answer["code"], "version", "{answer}");
    let text = answer["error"].as_str().unwrap();
    assert!(
        text.contains("\"v\" is \"1\"") && text.contains("whole number"),
        "{answer}"
    );
}

#[test]
fn the_python_client_serves_requests_after_a_watch_left_early() {
    let s = Scratch::new("python-watch-break");
    let d = TestDaemon::start_in(&s, "daemon.log");
    let stdout = run_python_check("watch_break_check.py", &d.socket, s.path());
    assert!(stdout.contains("all checks passed"), "{stdout}");
}
