//! A collected exit beats a late timer (issue 30, item 9): a stage that ended within its
//! timeout is not "timed out" because `orchestrate` itself was stalled (SIGSTOP, a loaded
//! machine) past the timeout before it looked.

use e2e_tests::{orchestrate, read_report, report_stage, wait_for, Scratch};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs a `sleep 0.5` stage with `timeout = "2s"`, stops orchestrate for 3 s while the stage
/// runs, and returns the stage's report record and orchestrate's exit status.
fn stalled_run(s: &Scratch) -> (serde_json::Value, Option<i32>) {
    let started = s.path().join("started");
    let plan = s.write(
        "plan.toml",
        &format!(
            "[[stage]]\nname = \"quick\"\ncommand = [\"sh\", \"-c\", \"touch {}; sleep 0.5; echo done > {{output}}/out\"]\noutputs = [\"out\"]\ntimeout = \"2s\"\n",
            started.display()
        ),
    );
    let run_dir = s.path().join("run");
    let mut child = Command::new(orchestrate())
        .arg("--plan")
        .arg(&plan)
        .arg("--run-dir")
        .arg(&run_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = Pid::from_raw(child.id() as i32);
    assert!(wait_for(Duration::from_secs(20), || started.exists()));
    kill(pid, Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    kill(pid, Signal::SIGCONT).unwrap();
    let status = child.wait().unwrap();
    let report = read_report(&run_dir);
    (report_stage(&report, "quick").clone(), status.code())
}

#[test]
fn a_stage_that_ended_in_time_is_not_timed_out_by_a_stalled_orchestrator() {
    // The race is between two wake-ups that come together; four runs at once make a fix that
    // only sometimes holds fail.
    let runs: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let s = Scratch::new(&format!("timeout-stall-{i}"));
                let got = stalled_run(&s);
                drop(s);
                got
            })
        })
        .collect();
    for run in runs {
        let (stage, code) = run.join().unwrap();
        assert_eq!(stage["status"], "succeeded", "{stage}");
        assert_eq!(code, Some(0), "{stage}");
    }
}
