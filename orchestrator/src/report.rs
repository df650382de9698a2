//! Building `report.json` and the end-of-run summary from the runner's state.

use crate::console::human_duration;
use protocol::report::Report;
use std::time::Duration;

/// Writes the report atomically (readers never see half a report).
pub fn write(path: &std::path::Path, report: &Report) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    crate::rundir::write_atomic(path, &bytes)
}

/// The report of a run directory, for `orchestrate report`. `report.json` is rewritten as the
/// run goes; when the journal shows the run never finished (a crash or `kill -9` stopped it
/// between rewrites), the stages' states are brought up to date from the journal and the run is
/// marked interrupted.
pub fn load_for_display(run_dir: &std::path::Path) -> Result<Report, String> {
    use crate::journal::{read_journal, JournalRecord};
    let path = run_dir.join("report.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut report: Report = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a report: {e}", path.display()))?;
    let records = read_journal(&run_dir.join("journal.jsonl")).unwrap_or_default();
    if matches!(records.last(), Some(JournalRecord::RunFinished { .. })) {
        return Ok(report);
    }
    report.status = "interrupted".into();
    for record in &records {
        let (stage, status, attempts) = match record {
            JournalRecord::StageStarted { stage, attempt, .. } => {
                (stage, "running", Some(*attempt))
            }
            JournalRecord::StageFinished {
                stage,
                status,
                attempt,
                ..
            } => (stage, status.as_str(), Some(*attempt)),
            JournalRecord::StageSkipped { stage, .. } => (stage, "skipped", None),
            _ => continue,
        };
        if let Some(s) = report.stages.iter_mut().find(|s| &s.name == stage) {
            s.status = if status == "running" {
                "interrupted".into()
            } else {
                status.into()
            };
            if let Some(a) = attempts {
                s.attempts = a;
            }
        }
    }
    Ok(report)
}

/// Writes the report, or tells the user on the console why it could not.
pub fn write_or_warn(path: &std::path::Path, report: &Report, console: &crate::console::Console) {
    if let Err(e) = write(path, report) {
        console.warn(&format!("cannot write {}: {e}", path.display()));
    }
}

/// A human table of the run: one row per stage, then where to look.
pub fn summary(report: &Report) -> String {
    let name_w = report
        .stages
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = String::new();
    out.push_str(&format!(
        "\n{:<name_w$}  {:<10} {:>3}  {:>8}  {}\n",
        "stage", "status", "try", "wall", "result"
    ));
    // A sweep's table would bury what matters: past 40 stages, show only those that did not
    // succeed, and a count of the rest.
    let long = report.stages.len() > 40;
    let mut hidden = 0usize;
    for s in &report.stages {
        if long && s.status == "succeeded" {
            hidden += 1;
            continue;
        }
        let wall = s
            .wall_s
            .map(|w| human_duration(Duration::from_secs_f64(w)))
            .unwrap_or_else(|| "-".into());
        let mut result = match &s.error {
            Some(e) => e.clone(),
            None => s
                .metrics
                .iter()
                .filter(|(k, _)| {
                    matches!(
                        k.as_str(),
                        "final_loss" | "loss" | "accuracy" | "perplexity" | "tokens_per_s"
                    )
                })
                .map(|(k, v)| {
                    if k == "tokens_per_s" {
                        format!("{k}={v:.0}")
                    } else {
                        format!("{k}={v:.4}")
                    }
                })
                .collect::<Vec<_>>()
                .join(" "),
        };
        for g in &s.gpu {
            result.push_str(&format!(
                " [{} {}: {:.1} ms]",
                &g.uuid[..g.uuid.len().min(12)],
                g.verdict,
                g.reclaim_ms
            ));
        }
        out.push_str(&format!(
            "{:<name_w$}  {:<10} {:>3}  {:>8}  {}\n",
            s.name, s.status, s.attempts, wall, result
        ));
    }
    if hidden > 0 {
        out.push_str(&format!(
            "… and {hidden} more stages that succeeded (see report.json)\n"
        ));
    }
    out.push_str(&crate::slurm::history::render(report));
    out.push_str(&format!(
        "\nrun {} in {} ({}); GPU check: {}\nrun directory: {}\n",
        report.status,
        human_duration(Duration::from_secs_f64(report.wall_s)),
        report.run_dir,
        report.gpu_check,
        report.run_dir
    ));
    out
}
