//! The first process of a stage run through srun: `orchestrate __slurm-srun --records DIR --
//! srun …`.
//!
//! srun answers SIGTERM by killing the job step's tasks at once (SIGKILL), which leaves a
//! distributed program no chance to checkpoint. So the orchestrator's graceful stop goes to
//! this launcher alone (the stage is marked `graceful_to_leader`), and the launcher asks Slurm
//! to send SIGTERM to every process of the step (`scancel --signal=TERM JOB.STEP`, the step
//! named by the tasks in `DIR/step`); srun then ends when the tasks do. Before the tasks have
//! started, or without `scancel`, srun itself gets the SIGTERM. The orchestrator's SIGKILL
//! after the grace period, or its death, still ends srun (SIGTERM through `PR_SET_PDEATHSIG`)
//! and with it the step. A task that ends while the step is being stopped exits 0 to srun
//! whatever its program did (see `super::task`), so when srun ends with 0 the launcher takes
//! the exit of the first task whose record says it failed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::hidden_args::{ENV_PLACED, LAUNCH_SUBCOMMAND, TASK_SUBCOMMAND};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn note_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Runs the launcher with its arguments (after the subcommand): `--records DIR -- srun ARGS…`.
/// Returns srun's exit status (128 + signal when a signal ended it).
pub fn run(args: Vec<String>) -> i32 {
    let (records, program) = match super::hidden_args::parse(LAUNCH_SUBCOMMAND, args) {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    let (exe, exe_args) = program.split_first().expect("hidden_args::parse checks it");
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: `note_stop` only stores to an atomic.
        unsafe { libc::signal(signal, note_stop as *const () as libc::sighandler_t) };
    }
    let mut cmd = Command::new(exe);
    cmd.args(exe_args);
    // SAFETY: the closure runs between fork and exec and calls only prctl.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            // If the launcher dies, srun ends the step (its answer to SIGTERM).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // A placed instance: its events come back on srun's stdout (`super::relay`).
    let relayed = std::env::var(ENV_PLACED).is_ok_and(|v| v == "1");
    if relayed {
        cmd.stdout(Stdio::piped());
    }
    // srun's stderr names the node a step was lost on (`super::lost`).
    cmd.stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("orchestrate {LAUNCH_SUBCOMMAND}: cannot start `{exe}`: {e}");
            return 127;
        }
    };
    let mut splitter = child.stdout.take().map(|out| {
        let socket = std::env::var_os(protocol::worker::ENV_EVENTS).map(std::path::PathBuf::from);
        std::thread::spawn(move || super::relay::split(out, std::io::stdout(), socket.as_deref()))
    });
    let mut stderr_watch = child
        .stderr
        .take()
        .map(|err| std::thread::spawn(move || super::lost::watch_stderr(err, std::io::stderr())));
    let mut stop_sent = false;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                use std::os::unix::process::ExitStatusExt;
                // Every event and line srun passed on is delivered before the stage ends.
                if let Some(s) = splitter.take() {
                    let _ = s.join();
                }
                let srun_said = stderr_watch.take().and_then(|w| w.join().ok()).flatten();
                let code = match (status.code(), status.signal()) {
                    (Some(0), _) => records
                        .as_deref()
                        .and_then(super::records::first_failure)
                        .unwrap_or(0),
                    (Some(code), _) => code,
                    (None, Some(sig)) => 128 + sig,
                    _ => 1,
                };
                // A step that ended without a started task's record was lost on its node.
                let lost = records.as_deref();
                if let Some(line) = lost.and_then(|r| super::lost::after_step(r, code, srun_said)) {
                    eprintln!("{line}");
                }
                return code;
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("orchestrate {LAUNCH_SUBCOMMAND}: cannot wait for `{exe}`: {e}");
                return 1;
            }
        }
        if STOP.load(Ordering::SeqCst) && !stop_sent {
            stop_sent = true;
            if !stop_step(records.as_deref()) {
                // SAFETY: signalling the child we spawned and have not reaped.
                unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `scancel --signal=TERM JOB.STEP` for the step the tasks named; false when it could not.
fn stop_step(records: Option<&Path>) -> bool {
    let Some(step) = records
        .and_then(|d| std::fs::read_to_string(d.join(super::records::STEP_FILE)).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
    else {
        return false;
    };
    let done = Command::new("scancel")
        .args(["--signal=TERM", &step])
        .stdin(Stdio::null())
        .status();
    match done {
        Ok(status) if status.success() => true,
        Ok(status) => {
            eprintln!("orchestrate {LAUNCH_SUBCOMMAND}: `scancel --signal=TERM {step}` {status}: stopping srun instead");
            false
        }
        Err(e) => {
            eprintln!(
                "orchestrate {LAUNCH_SUBCOMMAND}: cannot run scancel ({e}): stopping srun instead"
            );
            false
        }
    }
}

/// Runs a hidden subcommand of `orchestrate` (the srun launcher or the per-task wrapper) when
/// `args` (the whole argv) names one; returns its exit status.
pub fn hidden_subcommand(args: &[String]) -> Option<i32> {
    let rest = args.get(2..).unwrap_or_default().to_vec();
    match args.get(1).map(String::as_str) {
        Some(LAUNCH_SUBCOMMAND) => Some(run(rest)),
        Some(TASK_SUBCOMMAND) => Some(super::task::run(rest)),
        _ => None,
    }
}
