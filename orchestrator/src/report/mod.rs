//! Building `report.json` and the end-of-run summary from the run's stage records, which
//! [`stages::ReportSink`] keeps from the run's events.

pub mod console;
pub mod console_bars;
pub mod console_table;
pub mod placed;
pub(crate) mod results;
pub mod stages;

use crate::plan::LoadedPlan;
use crate::report::console::human_duration;
use crate::report::placed::Placed;
use crate::store::rundir::{RunDir, RunDirError};
use protocol::report::{Report, StageReport};
use protocol::status::{RunStatus, StageStatus};
use std::path::Path;
use std::time::Duration;
use std::time::Instant;

/// Writes the report atomically (readers never see half a report); not fsynced: the journal
/// is the durable record and `orchestrate report` rebuilds from it.
pub fn write(path: &std::path::Path, report: &Report) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    crate::store::rundir::write_replace(path, &bytes)
}

/// The report of a run directory, for `orchestrate report`. The journal is the truth:
/// `report.json` is rewritten as the run goes (and its rewrite can fail, on a full disk), so
/// every stage's state is brought up to date from the journal, a missing or unreadable
/// report is rebuilt from it, and the run is shown as running (its directory's lock is held),
/// finished, or interrupted (neither).
pub fn load_for_display(run_dir: &Path) -> Result<Report, RunDirError> {
    use crate::store::journal::{read_run_journal, JournalRecord};
    let root = crate::store::rundir::existing_run(run_dir)?;
    let records = read_run_journal(&root).map_err(crate::store::rundir::io_at(&root))?;
    let path = root.join("report.json");
    let mut report: Report = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_else(|| Report {
            v: protocol::PROTOCOL_VERSION,
            run_dir: root.display().to_string(),
            status: RunStatus::Running,
            gpu_check: "unknown (report.json could not be read; rebuilt from the journal)".into(),
            wall_s: 0.0,
            stages: Vec::new(),
            slurm: placed::job_from_journal(&records),
        });
    // A moved or copied run directory: show where its files are now.
    let recorded_root = std::mem::replace(&mut report.run_dir, root.display().to_string());
    if recorded_root != report.run_dir {
        for s in &mut report.stages {
            if let Some(rest) = s.output_dir.strip_prefix(&recorded_root) {
                s.output_dir = format!("{}{rest}", report.run_dir);
            }
            for c in &mut s.checkpoints {
                if let Some(rest) = c.path.strip_prefix(&recorded_root) {
                    c.path = format!("{}{rest}", report.run_dir);
                }
            }
        }
    }
    let mut finished: Option<RunStatus> = None;
    // Stages by name: the journal of a 100,000-stage sweep has 200,000 records.
    let mut index: std::collections::HashMap<String, usize> = report
        .stages
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.clone(), i))
        .collect();
    for record in &records {
        let (name, status, attempt) = match record {
            JournalRecord::RunStarted { .. } => {
                finished = None;
                continue;
            }
            JournalRecord::RunFinished { status, .. } => {
                finished = Some(*status);
                continue;
            }
            JournalRecord::StageStarted { stage, attempt, .. } => {
                (stage, StageStatus::Running, Some(*attempt))
            }
            JournalRecord::StageFinished {
                stage,
                status,
                attempt,
                ..
            } => (stage, *status, Some(*attempt)),
            JournalRecord::StageSkipped { stage, .. } => (stage, StageStatus::Skipped, None),
            JournalRecord::SlurmStarted { .. } | JournalRecord::SlurmStopped { .. } => continue,
        };
        let idx = match index.get(name) {
            Some(&i) => i,
            None => {
                report.stages.push(empty_stage(name, &root));
                index.insert(name.clone(), report.stages.len() - 1);
                report.stages.len() - 1
            }
        };
        let s = &mut report.stages[idx];
        let stale = s.status != status || attempt.is_some_and(|a| a != s.attempts);
        s.status = status;
        if let Some(a) = attempt {
            s.attempts = a;
        }
        if !stale {
            continue;
        }
        match record {
            JournalRecord::StageFinished {
                error,
                checkpoints,
                metrics,
                wall_s,
                ..
            } => {
                s.error = error.clone();
                s.checkpoints = checkpoints.clone();
                s.metrics = metrics.clone();
                s.wall_s = *wall_s;
            }
            JournalRecord::StageSkipped { reason, .. } => s.error = Some(reason.clone()),
            _ => {
                s.error = None;
                s.wall_s = None;
            }
        }
    }
    let live = crate::store::rundir::live_owner(&root);
    report.status = match (finished, &live) {
        (Some(status), _) => status,
        (None, Some(_)) => RunStatus::Running,
        (None, None) => RunStatus::Interrupted,
    };
    if report.status != RunStatus::Running {
        for s in &mut report.stages {
            if s.status == StageStatus::Running {
                s.status = StageStatus::Interrupted;
            }
        }
    }
    Ok(report)
}

pub(crate) fn empty_stage(name: &str, root: &Path) -> StageReport {
    let output_dir = root.join("stages").join(name).join("output");
    pending_stage(name, output_dir.display().to_string())
}

/// Writes the report, or tells the user on the console why it could not.
pub fn write_or_warn(path: &std::path::Path, report: &Report, console: &crate::events::Events) {
    if let Err(e) = write(path, report) {
        console.warn(&format!("cannot write {}: {e}", path.display()));
    }
}

/// A human table of the run: one row per stage (each stage's kind, for its headline metrics,
/// from the plan copy in its run directory), then where to look.
pub fn summary(report: &Report) -> String {
    let kinds = console_table::kinds_of_run(Path::new(&report.run_dir));
    let rows = report.stages.iter().map(|s| console_table::Row {
        stage: s.clone(),
        kind: (kinds.get(&s.name).copied()).unwrap_or(console_table::Kind::Command),
        in_results: false,
    });
    render_summary(report, rows)
}

/// [`summary`] of `header` (a report whose stages are not used) and `stages`, taken one at a
/// time: past 40 stages only those that did not succeed are kept for the table.
fn render_summary(header: &Report, stages: impl Iterator<Item = console_table::Row>) -> String {
    let report = header;
    let mut total = 0usize;
    let mut shown: Vec<console_table::Row> = Vec::new();
    let mut hidden = 0usize;
    let mut finished = 0usize;
    // srun stages' tasks and node checks, whether or not their row is shown.
    let mut srun = String::new();
    // Every leaked GPU, by stage, for the summary's last line.
    let mut leaks: Vec<String> = Vec::new();
    for row in stages {
        let s = &row.stage;
        total += 1;
        leaks.extend(leak_lines(s));
        if !matches!(s.status, StageStatus::Pending | StageStatus::Running) {
            finished += 1;
        }
        if !s.tasks.is_empty() || !s.nodes.is_empty() {
            srun.push_str(&placed::stage_lines(s));
        }
        if total > 40 && s.status == StageStatus::Succeeded {
            hidden += 1;
            continue;
        }
        shown.push(row);
    }
    // A sweep's table would bury what matters: past 40 stages, show only those that did not
    // succeed, and a count of the rest.
    if total > 40 {
        let before = shown.len();
        shown.retain(|r| r.stage.status != StageStatus::Succeeded);
        hidden += before - shown.len();
    }
    let mut out = console_table::render(&shown);
    if hidden > 0 {
        out.push_str(&format!(
            "… and {hidden} more stages that succeeded (see report.json)\n"
        ));
    }
    out.push_str(&srun);
    out.push_str(&placed::job_lines(report));
    // A live run's report.json holds the time of its last rewrite, not the run's: say how far
    // it has come instead.
    let took = if report.status == RunStatus::Running {
        format!("so far, {finished} of {total} stages finished")
    } else {
        format!(
            "in {}",
            human_duration(Duration::from_secs_f64(report.wall_s))
        )
    };
    out.push_str(&format!(
        "\nrun {} {took} ({}); GPU check: {}\nrun directory: {}\n",
        report.status.label(),
        report.run_dir,
        report.gpu_check,
        report.run_dir
    ));
    if !leaks.is_empty() {
        // The last line: a leak never ends the run looking like a success.
        out.push_str(&format!(
            "run {}: {} (exit status {})\n",
            report.status.label(),
            leaks.join("; "),
            crate::exit::GPU_LEAK
        ));
    }
    if report.status == RunStatus::Interrupted {
        out.push_str(&format!(
            "continue it with: orchestrate resume {}\n",
            report.run_dir
        ));
    }
    out
}

/// What a stage's latest attempt left on GPUs whose verdict is `leaked`: "`a` left 1024 MiB
/// on GPU-…".
fn leak_lines(stage: &StageReport) -> impl Iterator<Item = String> + '_ {
    stage
        .gpu
        .iter()
        .filter(|g| g.verdict == protocol::report::GpuVerdict::Leaked)
        .map(|g| {
            format!(
                "`{}` left {} MiB on {}",
                stage.name,
                g.after_bytes.saturating_sub(g.baseline_bytes) >> 20,
                g.uuid
            )
        })
}

/// The metrics a stage reported, as `name=value` pairs: the usual ones first (loss,
/// accuracy, …), then every other one the stage chose to report (milestone timestamps `t_*`
/// aside), at most 8 in all.
pub(crate) fn metrics_text(metrics: &std::collections::BTreeMap<String, f64>) -> String {
    const FIRST: [&str; 5] = [
        "final_loss",
        "loss",
        "accuracy",
        "perplexity",
        "tokens_per_s",
    ];
    // `t_*` are milestone timestamps of the attempt (in report.json), not results.
    let mut keys: Vec<&String> = metrics.keys().filter(|k| !k.starts_with("t_")).collect();
    keys.sort_by_key(|k| FIRST.iter().position(|f| f == k).unwrap_or(FIRST.len()));
    let mut parts: Vec<String> = keys
        .iter()
        .take(8)
        .map(|k| {
            let v = metrics[*k];
            if k.as_str() == "tokens_per_s" || (v.fract() == 0.0 && v.abs() < 1e15) {
                format!("{k}={v:.0}")
            } else {
                format!("{k}={v:.4}")
            }
        })
        .collect();
    if keys.len() > 8 {
        parts.push(format!("(+{} more)", keys.len() - 8));
    }
    parts.join(" ")
}

/// What a run knows of its stages, as its report reads them one at a time: the records kept
/// from the run's events ([`stages::StageRecords`]), or every stage pending as a run starts.
/// `Sync`: the run's results are written beside its report, from the same snapshot.
pub(crate) trait StageFacts: Sync {
    /// Stage `i`'s record as the run knows it (status, attempts, failure, its last attempt's
    /// facts), named `name` with its outputs under `output_dir`; where it ran (its tasks, nodes
    /// and lost attempts) is left empty for the report to add.
    fn stage_report(&self, i: usize, name: &str, output_dir: String) -> StageReport;
}

/// A run that has just started: every stage pending and never attempted (no state per stage is
/// needed for that: a sweep's would be megabytes).
struct AllPending;

impl StageFacts for AllPending {
    fn stage_report(&self, _: usize, name: &str, output_dir: String) -> StageReport {
        pending_stage(name, output_dir)
    }
}

/// The record of a stage not attempted yet.
pub(crate) fn pending_stage(name: &str, output_dir: String) -> StageReport {
    StageReport {
        name: name.to_string(),
        status: StageStatus::Pending,
        attempts: 0,
        exit_code: None,
        signal: None,
        error: None,
        failure: None,
        stderr_tail: None,
        output_dir,
        checkpoints: Vec::new(),
        wall_s: None,
        metrics: Default::default(),
        gpu: Vec::new(),
        leftover_processes: Vec::new(),
        protocol_violations: Vec::new(),
        timing: None,
        started_early: false,
        host: None,
        tasks: Vec::new(),
        nodes: Vec::new(),
        lost: Vec::new(),
        start: None,
    }
}

/// A run's report as of now, built one stage at a time from the run's stage records as it is
/// written or summarised: never held whole (a 100,000-stage sweep's report is tens of
/// megabytes of JSON). Serializes exactly as [`Report`] does.
pub(crate) struct Snapshot<'a> {
    plan: &'a LoadedPlan,
    /// What the run knows of each stage (see [`Snapshot::all_pending`] for a run that has
    /// just started).
    records: &'a dyn StageFacts,
    run_dir: &'a RunDir,
    /// Where the stages ran: the Slurm job and what each stage's job steps left.
    placed: &'a dyn Placed,
    /// The report without its stages.
    header: Report,
}

impl<'a> Snapshot<'a> {
    /// The report of a run from its stages' records (`status`: the run's, so far), its stages
    /// placed as `placed` says.
    pub(crate) fn new(
        plan: &'a LoadedPlan,
        records: &'a dyn StageFacts,
        run_dir: &'a RunDir,
        gpu_check: &str,
        started: Instant,
        status: RunStatus,
        placed: &'a dyn Placed,
    ) -> Snapshot<'a> {
        Snapshot {
            plan,
            records,
            run_dir,
            header: Report {
                v: protocol::PROTOCOL_VERSION,
                run_dir: run_dir.root().display().to_string(),
                status,
                gpu_check: gpu_check.into(),
                wall_s: started.elapsed().as_secs_f64(),
                stages: Vec::new(),
                slurm: placed.job(),
            },
            placed,
        }
    }

    /// The report of a run that has just started, every stage pending and never attempted
    /// (no state per stage is needed for that: a sweep's would be megabytes).
    pub(crate) fn all_pending(
        plan: &'a LoadedPlan,
        run_dir: &'a RunDir,
        gpu_check: &str,
        started: Instant,
        placed: &'a dyn Placed,
    ) -> Snapshot<'a> {
        let status = RunStatus::Running;
        Snapshot::new(
            plan,
            &AllPending,
            run_dir,
            gpu_check,
            started,
            status,
            placed,
        )
    }

    /// How many stages the plan has.
    pub(crate) fn len(&self) -> usize {
        self.plan.plan.stages.len()
    }

    /// Stage `i`'s record: what the run knows of it, and where it ran.
    pub(crate) fn stage(&self, i: usize) -> StageReport {
        let stage = &self.plan.plan.stages[i];
        let output_dir = self.run_dir.output_dir(&stage.name).display().to_string();
        let mut record = self.records.stage_report(i, &stage.name, output_dir);
        // srun stages: their tasks and the GPU check of their nodes (empty otherwise).
        let placed = self
            .placed
            .stage(stage, &self.run_dir.stage_dir(&stage.name));
        record.tasks = placed.tasks;
        record.nodes = placed.nodes;
        record.lost = placed.lost;
        record
    }

    /// Every stage's record, in plan order, built as it is taken.
    pub(crate) fn stages(&self) -> impl Iterator<Item = StageReport> + '_ {
        (0..self.len()).map(|i| self.stage(i))
    }

    /// The whole report, every stage held: for a reader that needs it at once (the experiment
    /// tracker at the run's end), not for `report.json`, which is streamed.
    pub(crate) fn to_report(&self) -> Report {
        Report {
            stages: self.stages().collect(),
            ..self.header.clone()
        }
    }

    /// Writes `report.json` (streamed; see [`write`] for the promises), or tells the user on
    /// the console why it could not.
    pub(crate) fn write_or_warn(&self, path: &Path, console: &crate::events::Events) {
        if let Err(e) = crate::store::rundir::write_json_replace(path, self) {
            console.warn(&format!("cannot write {}: {e}", path.display()));
        }
    }

    /// The human summary (see [`summary`]).
    /// Matrix instances show no metrics in it when the results table shows them.
    pub(crate) fn summary(&self) -> String {
        let results = results::has_rows(self.plan);
        let rows = self
            .stages()
            .enumerate()
            .map(|(i, stage)| console_table::Row {
                kind: console_table::Kind::of(self.plan.plan.stages[i].kind),
                in_results: results && self.plan.instances[i].is_some(),
                stage,
            });
        render_summary(&self.header, rows)
    }
}

impl serde::Serialize for Snapshot<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Stages<'s, 'a>(&'s Snapshot<'a>);
        impl serde::Serialize for Stages<'_, '_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.stages())
            }
        }
        let h = &self.header;
        let fields = if h.slurm.is_some() { 7 } else { 6 };
        let mut report = serializer.serialize_struct("Report", fields)?;
        report.serialize_field("v", &h.v)?;
        report.serialize_field("run_dir", &h.run_dir)?;
        report.serialize_field("status", &h.status)?;
        report.serialize_field("gpu_check", &h.gpu_check)?;
        report.serialize_field("wall_s", &h.wall_s)?;
        report.serialize_field("stages", &Stages(self))?;
        if let Some(slurm) = &h.slurm {
            report.serialize_field("slurm", slurm)?;
        }
        report.end()
    }
}

#[cfg(test)]
mod tests {
    use protocol::report::{Report, TaskRecord};
    use protocol::status::{RunStatus, StageStatus};

    #[test]
    fn a_sweep_summary_lists_failures_and_every_srun_stages_tasks() {
        let mut stages: Vec<_> = (0..50)
            .map(|i| super::empty_stage(&format!("s{i}"), std::path::Path::new("/r")))
            .collect();
        for s in &mut stages {
            s.status = StageStatus::Succeeded;
        }
        stages[7].status = StageStatus::Failed;
        stages[7].error = Some("exit code 3".into());
        stages[45].tasks.push(TaskRecord {
            rank: 0,
            local_rank: 0,
            node: "n1".into(),
            exit_code: Some(7),
            signal: None,
        });
        let report = Report {
            v: protocol::PROTOCOL_VERSION,
            run_dir: "/r".into(),
            status: RunStatus::Failed,
            gpu_check: "off".into(),
            wall_s: 1.0,
            stages,
            slurm: None,
        };
        let text = super::summary(&report);
        assert!(
            text.contains("s7 ") && text.contains("exit code 3"),
            "{text}"
        );
        assert!(
            !text.contains("s45 "),
            "a succeeded row of a sweep is hidden: {text}"
        );
        assert!(
            text.contains("… and 49 more stages that succeeded"),
            "{text}"
        );
        assert!(text.contains("s45: tasks: rank 0 on n1: exit 7"), "{text}");
    }
    #[test]
    fn every_reported_metric_is_shown_the_usual_ones_first() {
        let metrics = [
            ("bleu", 31.25),
            ("rouge_l", 0.5),
            ("loss", 1.5),
            ("t_first_step", 1e9),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(
            super::metrics_text(&metrics),
            "loss=1.5000 bleu=31.2500 rouge_l=0.5000"
        );
    }
}
