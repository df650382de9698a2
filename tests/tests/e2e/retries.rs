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

/// A step that arrives only after the stage's main process has exited counts for its attempt
/// as one that came while it ran: here a helper process of the stage reports step 5 when it is
/// stopped (SIGTERM, after the main process exited 1), so the event is read only after the
/// exit, every attempt. Three restarts that got no further still stop the retries.
#[test]
fn a_step_reported_after_the_main_process_exited_counts_for_its_attempt() {
    let s = Scratch::new("late-progress");
    let script = s.write(
        "late.py",
        "import json, os, signal, socket, sys, time\n\
         path = os.environ['ORCHESTRATE_EVENTS']\n\
         ready, told = os.pipe()\n\
         if os.fork() == 0:\n\
         \x20   def report(*_):\n\
         \x20       s = socket.socket(socket.AF_UNIX)\n\
         \x20       s.connect(path)\n\
         \x20       s.sendall((json.dumps({'v': 1, 'event': 'progress', 'step': 5}) + '\\n').encode())\n\
         \x20       s.close()\n\
         \x20       os._exit(0)\n\
         \x20   signal.signal(signal.SIGTERM, report)\n\
         \x20   os.write(told, b'.')\n\
         \x20   while True:\n\
         \x20       time.sleep(1)\n\
         os.read(ready, 1)\n\
         sys.exit(1)\n",
    );
    let plan = s.write(
        "plan.toml",
        &format!(
            "[[stage]]\nname = \"late\"\nretries = 4\ncommand = [\"python3\", \"{}\"]\n",
            script.display()
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let stage = run.stage("late");
    let error = stage["error"].as_str().unwrap();
    assert!(
        error.contains("not retried: 3 restarts in a row got no further than step 5"),
        "{error}\n{}",
        run.stderr
    );
    assert_eq!(stage["attempts"], 4, "{stage}");
}
