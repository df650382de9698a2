//! The end of a run: the stages that never started skipped, the run's status and exit code
//! (inside Slurm, after asking Slurm why the job stopped), and the files a finished run
//! leaves: the journal's last record, `report.json`, the results table, the GPU memory
//! picture.

use super::scheduler::{Scheduler, Verdict};
use super::setup::Setup;
use crate::attempt::launch::CancelLevel;
use crate::exit;
use crate::gpu;
use crate::report::Snapshot;
use crate::store::rundir::write_replace;
use protocol::status::RunStatus;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Inside Slurm, `scancel` and the time limit signal every process of the job at once: the
/// stop can arrive with the last stage's end. Waits a moment for it.
pub(super) async fn wait_for_late_stop(
    setup: &Setup,
    sched: &mut Scheduler<'_>,
    cancel: &mut watch::Receiver<CancelLevel>,
) {
    if !setup.placement.waits_for_late_stop(sched.stopping()) {
        return;
    }
    tokio::select! {
        biased;
        changed = cancel.changed() => {
            if changed.is_ok() && *cancel.borrow() != CancelLevel::None {
                sched.note_interrupted();
            }
        }
        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
    }
}

/// The run's status and exit code from the scheduler's verdict; inside Slurm, after a stop,
/// why the job stopped (from Slurm's job state), journaled, and the requeue asked for.
pub(super) async fn status_of(
    verdict: Verdict,
    setup: &mut Setup,
    stop_signal: Option<super::StopBy>,
) -> (RunStatus, i32) {
    let (status, exit_code) = match verdict {
        Verdict::Interrupted => (RunStatus::Interrupted, exit::INTERRUPTED),
        Verdict::Failed => (RunStatus::Failed, exit::STAGE_FAILED),
        Verdict::Leaked => (RunStatus::Leaked, exit::GPU_LEAK),
        Verdict::SucceededLeaked => (RunStatus::SucceededLeaked, exit::GPU_LEAK),
        Verdict::Succeeded => (RunStatus::Succeeded, exit::SUCCESS),
    };
    let Some(signal) = stop_signal.filter(|_| verdict == Verdict::Interrupted) else {
        return (status, exit_code);
    };
    let (reaper, journal) = (&setup.services.reaper, &setup.journal);
    match setup
        .placement
        .after_stop(signal, reaper, journal, &setup.events)
        .await
    {
        Some(stopped) => (stopped.status, stopped.exit_code),
        None => (status, exit_code),
    }
}

/// `report.json` and the results are independent files: written at once, on two threads (at
/// 100,000 stages each takes a tenth of a second or more, after the last stage).
pub(super) fn write_report_and_results(setup: &Setup, report: &Snapshot<'_>) {
    let (plan, events, root) = (&setup.plan, &setup.events, setup.run_dir.root());
    let results = std::thread::scope(|scope| {
        let results = crate::report::results::has_rows(plan).then(|| {
            scope.spawn(|| crate::report::results::write(plan, &|i| report.stage(i), root))
        });
        report.write_or_warn(&setup.run_dir.report_path(), events);
        results.map(|thread| {
            thread
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the results writer panicked")))
        })
    });
    match results {
        Some(Ok(table)) => {
            events.detail(&table);
            let csv = root.join("results.csv");
            events.note(&format!("results: {}", csv.display()));
        }
        Some(Err(e)) => events.warn(&format!(
            "cannot write the results in {}: {e}",
            root.display()
        )),
        None => {}
    }
}

/// The picture of every GPU's memory over the run, with the stages' spans.
pub(super) fn draw_gpu_memory(setup: &Setup, spans: &[gpu::timeline::StageSpan], started: Instant) {
    let root = setup.run_dir.root();
    let samples = gpu::timeline::read_samples(&root.join("gpu-timeline.csv"));
    let wall = started.elapsed().as_secs_f64();
    let picture = gpu::svg::render(&setup.cleared.gpus, &samples, spans, wall);
    let svg_path = root.join("gpu-memory.svg");
    match write_replace(&svg_path, picture.as_bytes()) {
        Ok(()) => setup
            .events
            .note(&format!("GPU memory picture: {}", svg_path.display())),
        Err(e) => setup
            .events
            .warn(&format!("cannot write {}: {e}", svg_path.display())),
    }
}

/// A finished run to log to the experiment tracker its plan names: where, and its report.
pub(super) struct Tracked {
    target: crate::tracking::Target,
    report: protocol::report::Report,
}

/// What [`track`] logs of the finished run (its final `report`), if its plan names a tracker
/// (a tracker it names wrongly is one warning).
pub(super) fn to_track(setup: &Setup, report: &Snapshot<'_>) -> Option<Tracked> {
    match crate::tracking::target(&setup.plan.plan.run) {
        Ok(Some(target)) => Some(Tracked {
            target,
            report: report.to_report(),
        }),
        Ok(None) => None,
        Err(e) => {
            setup.events.warn(&format!("tracking: {e}"));
            None
        }
    }
}

/// Logs the finished run to the experiment tracker, on a blocking thread (a daemon's runs
/// share this runtime). What happened is one line; nothing here changes the run's outcome.
pub(super) async fn track(setup: &Setup, tracked: Tracked) {
    let console = &setup.events;
    let Tracked { target, report } = tracked;
    let root = setup.run_dir.root().to_path_buf();
    let params = crate::tracking::stage_params(&setup.plan);
    let to = target.clone();
    let logged =
        tokio::task::spawn_blocking(move || crate::tracking::export(&to, &report, &params, &root))
            .await;
    match logged {
        Ok(Ok(logged)) => console.note(&format!(
            "tracking: MLflow run {} ({} stages) in experiment {:?} at {}",
            logged.run_id, logged.stages, target.experiment, target.uri
        )),
        Ok(Err(e)) => console.warn(&format!(
            "tracking: the run was not logged to {}: {e} (`orchestrate track {}` logs it later)",
            target.uri,
            setup.run_dir.root().display()
        )),
        Err(e) => console.warn(&format!("tracking: the exporter failed: {e}")),
    }
}
