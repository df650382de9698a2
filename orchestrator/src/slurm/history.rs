//! The job's record in the run directory: `slurm.json`, rewritten atomically at every start
//! and stop of the job (the journal has the same facts as records), and shown in the report.

use super::Allocation;
use crate::store::journal::{Journal, JournalRecord};
use protocol::report::{SlurmJobReport, SlurmStart, SlurmStop};
use std::path::{Path, PathBuf};

fn path(run_dir: &Path) -> PathBuf {
    run_dir.join("slurm.json")
}

/// The job's record of a run directory, when the run ran inside Slurm.
pub fn load(run_dir: &Path) -> Option<SlurmJobReport> {
    let bytes = std::fs::read(path(run_dir)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Whether a run directory has the job's record: some run in it ran inside Slurm.
pub fn exists(run_dir: &Path) -> bool {
    path(run_dir).exists()
}

fn save(run_dir: &Path, report: &SlurmJobReport) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
    crate::store::rundir::write_atomic(&path(run_dir), &bytes)
}

/// Journals this start of the job and adds it to `slurm.json`.
pub fn record_start(
    run_dir: &Path,
    job: &Allocation,
    journal: &mut Journal,
) -> std::io::Result<()> {
    journal.append(&JournalRecord::SlurmStarted {
        job_id: job.job_id.clone(),
        restart_count: job.restart_count,
        host: job.host.clone(),
        nodelist: job.nodelist.clone(),
    })?;
    let mut report = load(run_dir)
        .filter(|r| r.job_id == job.job_id)
        .unwrap_or_else(|| SlurmJobReport {
            job_id: job.job_id.clone(),
            nodelist: job.nodelist.clone(),
            restart_count: job.restart_count,
            starts: Vec::new(),
            stops: Vec::new(),
        });
    report.restart_count = job.restart_count;
    report.nodelist = job.nodelist.clone();
    report.starts.push(SlurmStart {
        at: crate::timefmt::unix_secs_f64(),
        restart_count: job.restart_count,
        host: job.host.clone(),
    });
    save(run_dir, &report)
}

/// Journals a stop of the job and adds it to `slurm.json`.
pub fn record_stop(
    run_dir: &Path,
    job: &Allocation,
    stop: SlurmStop,
    journal: &mut Journal,
) -> std::io::Result<()> {
    journal.append(&JournalRecord::SlurmStopped {
        job_id: job.job_id.clone(),
        restart_count: stop.restart_count,
        signal: stop.signal.clone(),
        cause: stop.cause.clone(),
        job_state: stop.job_state.clone(),
        requeue: stop.requeue.clone(),
    })?;
    let mut report = load(run_dir).unwrap_or_else(|| SlurmJobReport {
        job_id: job.job_id.clone(),
        nodelist: job.nodelist.clone(),
        restart_count: job.restart_count,
        starts: Vec::new(),
        stops: Vec::new(),
    });
    report.stops.push(stop);
    save(run_dir, &report)
}
