//! What a daemon's watchers learn of a run (issue 31, items 2 and 5): every state change is a
//! typed event (a retry, a skip with its class), and a plan that cannot run on the host is
//! refused in the answer to its `submit`, before any run exists.

use e2e_tests::daemon::TestDaemon;
use e2e_tests::{rss_kib, Scratch};
use serde_json::{json, Value};

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
    let d = TestDaemon::start_in(&s, "daemon.log");
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
    let d = TestDaemon::start_in(&s, "daemon.log");
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

#[test]
fn watchers_that_do_not_read_a_200000_event_replay_cost_the_daemon_a_bounded_amount() {
    // Before: each `watch --from 0` of a finished run read and parsed its whole event log on
    // the daemon's thread and held it: 8 such watchers took a release daemon from 7 MB to
    // 1,066 MB and stalled its socket 2.1-2.6 s; 835 MB stayed after they left.
    const EVENTS: usize = 200_000;
    const WATCHERS: usize = 8;
    let s = Scratch::new("replay-bounded");
    let mut d = TestDaemon::start_in(&s, "daemon.log");
    let id = d
        .connect()
        .submit_toml("[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n", s.path());
    assert_eq!(d.connect().wait(&id)["state"], "succeeded");
    assert!(d.stop_with(e2e_tests::daemon::Signal::SIGTERM).success());
    drop(d);
    // The finished run's log made long (the daemon counts its lines when it starts).
    let log = s.path().join("runs").join(&id).join("events.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text.lines().next().unwrap().to_string() + "\n";
    let mut long = text.clone();
    long.push_str(&line.repeat(EVENTS - text.lines().count()));
    std::fs::write(&log, long).unwrap();

    let d = TestDaemon::start_in(&s, "daemon.log");
    let run = d
        .connect()
        .call(json!({"v": 1, "type": "status", "id": id}));
    assert_eq!(run["runs"][0]["events"], EVENTS as u64, "{run}");
    let before = rss_kib(d.pid());
    let mut watchers = Vec::new();
    for _ in 0..WATCHERS {
        let mut w = d.connect();
        let request = json!({"v": 1, "type": "watch", "id": id, "from": 0});
        assert!(w.send_raw(format!("{request}\n").as_bytes()));
        watchers.push(w); // never read
    }
    // The daemon answers at once while they wait, and its memory stays bounded.
    let mut peak = before;
    for _ in 0..10 {
        let mut c = d.connect();
        let answer = c.call_within(
            json!({"v": 1, "type": "status", "id": id}),
            std::time::Duration::from_secs(2),
        );
        assert_eq!(answer["type"], "runs", "{answer}");
        peak = peak.max(rss_kib(d.pid()));
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // A reader that does read gets every event, in order.
    assert_eq!(events(&d, &id).len(), EVENTS);
    peak = peak.max(rss_kib(d.pid()));
    drop(watchers);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let after = rss_kib(d.pid());
    // Each watcher holds one piece of the log and what its socket buffers: a few MiB in all.
    assert!(
        peak < before + 64 * 1024,
        "the daemon went from {before} KiB to {peak} KiB with {WATCHERS} watchers"
    );
    assert!(
        after < before + 64 * 1024,
        "{after} KiB after the watchers left (from {before} KiB)"
    );
}
