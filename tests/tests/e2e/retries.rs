//! Retries that go nowhere stop: a stage that reports progress and fails at the same step
//! attempt after attempt is not restarted a fourth time in a row, whatever its `retries`.

use e2e_tests::{run_plan, Scratch};

#[test]
fn three_restarts_in_a_row_without_progress_stop_the_retries() {
    let s = Scratch::new("no-progress");
    // Reports step 5 (as if resumed from its checkpoint there), then fails, every attempt.
    let script = s.write(
        "stuck.py",
        "import json, os, socket, sys\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.connect(os.environ['ORCHESTRATE_EVENTS'])\n\
         s.sendall((json.dumps({'v': 1, 'event': 'progress', 'step': 5}) + '\\n').encode())\n\
         s.close()\n\
         sys.exit(1)\n",
    );
    let plan = s.write(
        "plan.toml",
        &format!(
            "[[stage]]\nname = \"stuck\"\nretries = 10\ncommand = [\"python3\", \"{}\"]\n",
            script.display()
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let stage = run.stage("stuck");
    // The first attempt, then three restarts that got no further.
    assert_eq!(stage["attempts"], 4, "{stage}");
    let error = stage["error"].as_str().unwrap();
    assert!(
        error.contains("not retried: 3 restarts in a row got no further than step 5"),
        "{error}"
    );
}
