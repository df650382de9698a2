//! A chain's next stage has its logs opened and its event socket bound while the stage before
//! it runs (so that it starts without opening anything): every stage's events still reach it
//! and no other, and a stage that will not start (its upstream failed) gives its socket back.

use e2e_tests::{run_plan, Scratch};

/// Sends `{"k": K}` as metrics on the stage's event socket and notes which socket it was.
const TALK: &str = "import json, os, socket, sys\nk = int(sys.argv[1])\nc = socket.socket(socket.AF_UNIX)\nc.connect(os.environ['ORCHESTRATE_EVENTS'])\nc.sendall((json.dumps({'v': 1, 'event': 'metrics', 'metrics': {'k': k}}) + '\\n').encode())\nc.close()\nopen(os.path.join(os.environ['ORCHESTRATE_OUTPUT_DIR'], 'socket'), 'w').write(os.environ['ORCHESTRATE_EVENTS'])\n";

#[test]
fn each_stage_of_a_chain_gets_its_own_events_through_a_socket_bound_ahead() {
    let s = Scratch::new("chain-events");
    s.write("talk.py", TALK);
    let mut plan = String::from("[run]\nmax_parallel = 1\n");
    for k in 0..8 {
        plan.push_str(&format!(
            "[[stage]]\nname = \"s{k}\"\ncommand = [\"python3\", \"talk.py\", \"{k}\"]\n"
        ));
        if k > 0 {
            plan.push_str(&format!("after = [\"s{}\"]\n", k - 1));
        }
    }
    let plan = s.write("plan.toml", &plan);
    let run = run_plan(&s, &plan, &["-q"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let mut sockets = Vec::new();
    for k in 0..8 {
        let name = format!("s{k}");
        assert_eq!(run.metric(&name, "k"), k as f64, "{name}'s events");
        sockets.push(
            std::fs::read_to_string(run.run_dir.join(format!("stages/{name}/output/socket")))
                .unwrap(),
        );
    }
    sockets.sort();
    sockets.dedup();
    assert_eq!(sockets.len(), 8, "a socket per stage: {sockets:?}");
}

#[test]
fn a_stage_that_will_not_start_gives_back_the_socket_bound_for_it() {
    let s = Scratch::new("chain-release");
    let run_dir = s.path().join("run");
    // `watch` runs beside the chain, waits until `fails`'s downstream is skipped, and lists
    // the event sockets then: only its own may be left (`then`'s was bound while `fails` ran).
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[run]
max_parallel = 2

[[stage]]
name = "fails"
command = ["sh", "-c", "sleep 0.3; exit 1"]

[[stage]]
name = "then"
after = ["fails"]
command = ["true"]

[[stage]]
name = "watch"
command = ["sh", "-c", "for i in $(seq 200); do grep -q stage_skipped {journal} && break; sleep 0.05; done; sleep 0.5; ls $(dirname $ORCHESTRATE_EVENTS) > {{output}}/sockets"]
"#,
            journal = run_dir.join("journal.jsonl").display()
        ),
    );
    let run = run_plan(&s, &plan, &["-q"]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(run.stage("then")["status"], "skipped");
    let left = std::fs::read_to_string(run_dir.join("stages/watch/output/sockets")).unwrap();
    let left: Vec<&str> = left.split_whitespace().collect();
    // `then` (stage 1) gave its socket back when it was skipped. `watch`'s own is there, and
    // `fails`'s may be: an ended stage's socket file is removed by the stage-files thread
    // with its next work or when the run ends.
    assert!(
        !left.contains(&"1-1.sock"),
        "sockets left once `then` was skipped: {left:?}"
    );
    assert!(left.contains(&"2-1.sock"), "{left:?}");
    assert!(
        left.iter().all(|s| ["0-1.sock", "2-1.sock"].contains(s)),
        "{left:?}"
    );
}

#[test]
fn a_downstream_stage_behind_a_long_queue_is_not_prepared_early() {
    let s = Scratch::new("chain-soon");
    // `late` waits only on `x0`, but comes after 20 other ready stages: its files are written
    // when it nears the front, not when `x0` starts. `look`, in the middle, records whether
    // they exist by then.
    let mut plan = String::from("[run]\nmax_parallel = 1\n");
    for k in 0..20 {
        plan.push_str(&format!(
            "[[stage]]\nname = \"x{k}\"\ncommand = [\"true\"]\n"
        ));
        if k == 10 {
            plan.push_str("[[stage]]\nname = \"look\"\ncommand = [\"sh\", \"-c\", \"if [ -e $ORCHESTRATE_RUN_DIR/stages/late/spec.json ]; then echo early; else echo not-yet; fi > {output}/seen\"]\n");
        }
    }
    plan.push_str("[[stage]]\nname = \"late\"\nafter = [\"x0\"]\ncommand = [\"true\"]\n");
    let plan = s.write("plan.toml", &plan);
    let run = run_plan(&s, &plan, &["-q"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stage("late")["status"], "succeeded");
    assert_eq!(
        std::fs::read_to_string(run.run_dir.join("stages/look/output/seen")).unwrap(),
        "not-yet\n"
    );
}
