//! What a daemon's watchers learn of a run (issue 31, items 2 and 5): every state change is a
//! typed event (a retry, a skip with its class), and a plan that cannot run on the host is
//! refused in the answer to its `submit`, before any run exists.

use e2e_tests::daemon::TestDaemon;
use e2e_tests::Scratch;
use serde_json::{json, Value};

fn start(s: &Scratch) -> TestDaemon {
    TestDaemon::start(
        &s.path().join("sock/d.sock"),
        &s.path().join("runs"),
        &s.path().join("daemon.log"),
    )
}

/// Every event of run `id`, from its first, until the run's end.
fn events(d: &TestDaemon, id: &str) -> Vec<Value> {
    let mut w = d.connect();
    let request = json!({"v": 1, "type": "watch", "id": id, "from": 0});
    assert!(w.send_raw(format!("{request}\n").as_bytes()));
    let mut events = Vec::new();
    loop {
        let answer = w.read().expect("the watch answers until the run's end");
        if answer["type"] == "finished" {
            return events;
        }
        assert_eq!(answer["type"], "event", "{answer}");
        events.push(answer["event"].clone());
    }
}

fn position(events: &[Value], what: impl Fn(&Value) -> bool) -> usize {
    events
        .iter()
        .position(what)
        .unwrap_or_else(|| panic!("no such event in {events:#?}"))
}

#[test]
fn a_retry_and_a_skip_reach_watchers_as_typed_events_in_order() {
    let s = Scratch::new("daemon-typed-events");
    let d = start(&s);
    let mut c = d.connect();
    let toml = "[[stage]]\nname = \"a\"\ncommand = [\"false\"]\nretries = 1\n\
                [[stage]]\nname = \"b\"\nafter = [\"a\"]\ncommand = [\"true\"]\n";
    let id = c.submit_toml(toml, s.path());
    assert_eq!(c.wait(&id)["state"], "failed");
    let events = events(&d, &id);
    let first_end = position(&events, |e| {
        e["event"] == "stage_finished" && e["stage"] == "a" && e["status"] == "failed"
    });
    let retrying = position(&events, |e| e["event"] == "stage_retrying");
    let second_start = position(&events, |e| {
        e["event"] == "stage_started" && e["stage"] == "a" && e["attempt"] == 2
    });
    assert!(
        first_end < retrying && retrying < second_start,
        "{events:#?}"
    );
    let r = &events[retrying];
    assert_eq!(
        (&r["stage"], &r["attempt"], &r["error"]),
        (&json!("a"), &json!(1), &json!("exited with code 1"))
    );
    assert_eq!(r["retry_in_s"].as_f64(), Some(0.5));
    // After the second failure: no retry, and `b` is skipped for it, with the class.
    assert_eq!(
        events
            .iter()
            .filter(|e| e["event"] == "stage_retrying")
            .count(),
        1
    );
    let skipped = &events[position(&events, |e| e["event"] == "stage_skipped")];
    assert_eq!(skipped["stage"], "b");
    assert_eq!(skipped["class"], "upstream_failed");
    assert_eq!(skipped["reason"], "upstream stage `a` did not succeed");
    assert!(
        !events
            .iter()
            .any(|e| e["event"] == "stage_started" && e["stage"] == "b"),
        "{events:#?}"
    );
}

#[test]
fn a_plan_the_host_cannot_run_is_refused_at_submit_and_no_run_is_created() {
    let s = Scratch::new("daemon-refused");
    let d = start(&s);
    let mut c = d.connect();
    // Refused on any machine: without NVML for `gpu_check = "required"`, with it for the
    // GPUs the stage asks for.
    let toml = "[run]\ngpu_check = \"required\"\n\
                [[stage]]\nname = \"a\"\ncommand = [\"true\"]\ngpus = 64\n";
    let answer = c.call(json!({
        "v": 1, "type": "submit", "plan": {"toml": toml}, "base_dir": s.path(),
    }));
    assert_eq!(answer["type"], "error", "{answer}");
    assert_eq!(answer["code"], "refused", "{answer}");
    let message = answer["error"].as_str().unwrap();
    assert!(
        message.contains("gpu_check = \"required\"") || message.contains("asks for 64 GPUs"),
        "{message}"
    );
    assert!(c.list().is_empty(), "no run was accepted");
    let runs = std::fs::read_dir(s.path().join("runs"))
        .map(|d| d.flatten().filter(|e| e.path().is_dir()).count())
        .unwrap_or(0);
    assert_eq!(runs, 0, "no run directory was created");
}
