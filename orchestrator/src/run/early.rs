//! Early starts, the run loop's side: whether they are on, the mark an early start leaves in
//! its stage's directory, and the stop that reaches one early-started stage alone.
//!
//! The mark (`stages/<name>/early-start`) is written before an early attempt spawns and
//! removed once the stage's success is recorded. A stage started again while its directory
//! holds it — a retry after its early attempt was void, or a resumed run after `orchestrate`
//! was killed before the stage's finish was recorded — has its output directory emptied
//! first: what an early attempt wrote came from an upstream output that was never recorded
//! finished, so no later attempt resumes from it or reports it as complete.
//! (The mark is not fsynced: it guards against `orchestrate` being killed, not against a
//! power loss.)

use crate::attempt::launch::CancelLevel;
use crate::store::rundir::RunDir;
use std::path::Path;
use tokio::sync::{oneshot, watch};

/// How an early-started stage is stopped: SIGKILL to its whole tree at once (what it would save
/// on a SIGTERM is built on an upstream that failed, and is emptied before its next start
/// anyway; see above). Its cgroup, killed, is not reused (`StageCgroup::remove`).
const STOP_LEVEL: CancelLevel = CancelLevel::Kill;

/// The mark's file name in the stage's directory.
const MARK: &str = "early-start";

/// Before an attempt of stage `name` starts: empties its output directory if an early
/// attempt left the mark, then writes the mark if this one is `early`.
pub(super) fn before_start(run_dir: &RunDir, name: &str, early: bool) -> std::io::Result<()> {
    let mark = run_dir.stage_dir(name).join(MARK);
    if mark.is_file() {
        empty_dir(&run_dir.output_dir(name))?;
        if !early {
            std::fs::remove_file(&mark)?;
        }
    } else if early {
        std::fs::create_dir_all(run_dir.stage_dir(name))?;
        std::fs::write(&mark, b"")?;
    }
    Ok(())
}

/// Stage `name`'s success is recorded: its mark goes.
pub(super) fn finished(run_dir: &RunDir, name: &str) {
    let _ = std::fs::remove_file(run_dir.stage_dir(name).join(MARK));
}

/// Removes everything in `dir` (which stays; a missing one is fine).
fn empty_dir(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// A cancel channel for one stage: the run's cancels (`run`) passed on, and a stop of this
/// stage alone ([`STOP_LEVEL`]) when the sender returned fires. Runs on the current
/// `LocalSet`.
pub(super) fn stoppable(
    mut run: watch::Receiver<CancelLevel>,
) -> (watch::Receiver<CancelLevel>, oneshot::Sender<()>) {
    let (tx, rx) = watch::channel(*run.borrow_and_update());
    let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
    // Levels only rise: a stop never lowers the run's kill, nor the run's graceful stop a kill.
    let raise = |tx: &watch::Sender<CancelLevel>, level: CancelLevel| {
        tx.send_if_modified(|l| {
            let higher = level > *l;
            if higher {
                *l = level;
            }
            higher
        });
    };
    tokio::task::spawn_local(async move {
        let mut stop_open = true;
        loop {
            tokio::select! {
                changed = run.changed() => match changed {
                    Ok(()) => raise(&tx, *run.borrow_and_update()),
                    // Nobody cancels the run any more: only the stage's own stop is left.
                    Err(_) => break,
                },
                stopped = &mut stop_rx, if stop_open => {
                    stop_open = false;
                    if stopped.is_ok() {
                        raise(&tx, STOP_LEVEL);
                    }
                }
                () = tx.closed() => return,
            }
        }
        if stop_open && stop_rx.await.is_ok() {
            raise(&tx, STOP_LEVEL);
        }
        tx.closed().await;
    });
    (rx, stop_tx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_empties_the_output_before_the_next_start_and_goes_with_a_recorded_success() {
        let scratch = e2e_tests::Scratch::new("early-mark");
        let run_dir = RunDir::create(&scratch.path().join("run")).unwrap();
        let out = run_dir.output_dir("b");
        std::fs::create_dir_all(out.join("sub")).unwrap();
        std::fs::write(out.join("manifest.json"), b"{}").unwrap();
        // An ordinary start keeps what is there (a retry resumes from it).
        before_start(&run_dir, "b", false).unwrap();
        assert!(out.join("manifest.json").is_file());
        // An early start marks; the start after it finds the output emptied.
        before_start(&run_dir, "b", true).unwrap();
        assert!(
            out.join("manifest.json").is_file(),
            "the early start itself keeps it"
        );
        std::fs::write(out.join("model.safetensors"), b"x").unwrap();
        before_start(&run_dir, "b", false).unwrap();
        assert!(out.is_dir());
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
        assert!(!run_dir.stage_dir("b").join(MARK).exists());
        before_start(&run_dir, "b", true).unwrap();
        finished(&run_dir, "b");
        std::fs::write(out.join("manifest.json"), b"{}").unwrap();
        before_start(&run_dir, "b", false).unwrap();
        assert!(out.join("manifest.json").is_file());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_stop_reaches_one_stage_and_the_runs_cancels_still_reach_every_one() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let (run_tx, run_rx) = watch::channel(CancelLevel::None);
                let (mut a, stop_a) = stoppable(run_rx.clone());
                let (mut b, _stop_b) = stoppable(run_rx);
                stop_a.send(()).unwrap();
                a.changed().await.unwrap();
                assert_eq!(*a.borrow_and_update(), STOP_LEVEL);
                assert_eq!(*b.borrow(), CancelLevel::None, "b was not stopped");
                // The run's graceful stop reaches b, and never lowers a's level.
                run_tx.send_replace(CancelLevel::Graceful);
                b.changed().await.unwrap();
                assert_eq!(*b.borrow_and_update(), CancelLevel::Graceful);
                tokio::task::yield_now().await;
                assert_eq!(
                    *a.borrow_and_update(),
                    STOP_LEVEL.max(CancelLevel::Graceful)
                );
                // The run's kill reaches both.
                run_tx.send_replace(CancelLevel::Kill);
                b.changed().await.unwrap();
                assert_eq!(*b.borrow_and_update(), CancelLevel::Kill);
                tokio::task::yield_now().await;
                assert_eq!(*a.borrow(), CancelLevel::Kill);
            })
            .await;
    }
}
