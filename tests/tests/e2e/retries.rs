//! Retries that go nowhere stop: a stage that reports progress and fails at the same step
//! attempt after attempt is not restarted a fourth time in a row, whatever its `retries`.

use e2e_tests::{run_plan, RunResult, Scratch};

/// Python that defines `report_step_5()`: one `progress` event with step 5 on the stage's
/// event channel, on a connection of its own.
const REPORT_STEP_5: &str = "import json, os, socket\n\
def report_step_5():\n\
\x20   s = socket.socket(socket.AF_UNIX)\n\
\x20   s.connect(os.environ['ORCHESTRATE_EVENTS'])\n\
\x20   s.sendall((json.dumps({'v': 1, 'event': 'progress', 'step': 5}) + '\\n').encode())\n\
\x20   s.close()\n";

/// Runs stage `name` as `python3` on [`REPORT_STEP_5`] followed by `body`, with `retries`.
fn run_python_stage(s: &Scratch, name: &str, retries: u32, body: &str) -> RunResult {
    let script = s.write(&format!("{name}.py"), &format!("{REPORT_STEP_5}{body}"));
    let plan = s.write(
        "plan.toml",
        &format!(
            "[[stage]]\nname = \"{name}\"\nretries = {retries}\ncommand = [\"python3\", \"{}\"]\n",
            script.display()
        ),
    );
    run_plan(s, &plan, &[])
}

/// What every attempt of these stages gets no further than, and the retries stop on.
const STUCK: &str = "not retried: 3 restarts in a row got no further than step 5";

#[test]
fn three_restarts_in_a_row_without_progress_stop_the_retries() {
    let s = Scratch::new("no-progress");
    // Reports step 5 (as if resumed from its checkpoint there), then fails, every attempt.
    let run = run_python_stage(
        &s,
        "stuck",
        10,
        "import sys\nreport_step_5()\nsys.exit(1)\n",
    );
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let stage = run.stage("stuck");
    // The first attempt, then three restarts that got no further.
    assert_eq!(stage["attempts"], 4, "{stage}");
    let error = stage["error"].as_str().unwrap();
    assert!(error.contains(STUCK), "{error}");
}

/// A step that arrives only after the stage's main process has exited counts for its attempt
/// as one that came while it ran: here a helper process of the stage reports step 5 when it is
/// stopped (SIGTERM, after the main process exited 1), so the event is read only after the
/// exit, every attempt. Three restarts that got no further still stop the retries.
#[test]
fn a_step_reported_after_the_main_process_exited_counts_for_its_attempt() {
    let s = Scratch::new("late-progress");
    let run = run_python_stage(
        &s,
        "late",
        4,
        "import signal, sys, time\n\
         ready, told = os.pipe()\n\
         if os.fork() == 0:\n\
         \x20   def on_term(*_):\n\
         \x20       report_step_5()\n\
         \x20       os._exit(0)\n\
         \x20   signal.signal(signal.SIGTERM, on_term)\n\
         \x20   os.write(told, b'.')\n\
         \x20   while True:\n\
         \x20       time.sleep(1)\n\
         os.read(ready, 1)\n\
         sys.exit(1)\n",
    );
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let stage = run.stage("late");
    let error = stage["error"].as_str().unwrap();
    assert!(error.contains(STUCK), "{error}\n{}", run.stderr);
    assert_eq!(stage["attempts"], 4, "{stage}");
}
