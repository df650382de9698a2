//! The end-of-run table on the console: one row per stage, every column padded to its widest
//! cell whatever the statuses, each stage's headline metrics first (by its kind) and a count of
//! the rest, which `report.json` has.

use crate::report::console::human_wall;
use protocol::report::StageReport;
use std::collections::BTreeMap;
use std::time::Duration;

/// What a stage is, for choosing its headline metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The built-in `train` task: its final loss and throughput.
    Train,
    /// The built-in `eval` task: its accuracy and loss.
    Eval,
    /// A command, or a stage of unknown kind: whatever it reported.
    Command,
}

impl Kind {
    /// The kind of a plan's `kind` word (`None`: a command stage).
    pub fn of(builtin: Option<protocol::plan::BuiltinKind>) -> Kind {
        match builtin {
            Some(protocol::plan::BuiltinKind::Train) => Kind::Train,
            Some(protocol::plan::BuiltinKind::Eval) => Kind::Eval,
            None => Kind::Command,
        }
    }

    /// The metrics shown first for this kind, in order, when the stage reported them.
    pub fn headline(self) -> &'static [&'static str] {
        match self {
            Kind::Train => &["final_loss", "tokens_per_s"],
            Kind::Eval => &["accuracy", "loss"],
            Kind::Command => &[],
        }
    }
}

/// The kind of each stage of the run in `root`, by name, from its plan copy; empty when that
/// cannot be read or no longer loads (every stage then shows what it reported).
pub fn kinds_of_run(root: &std::path::Path) -> std::collections::HashMap<String, Kind> {
    let Ok((path, format, base)) = crate::store::rundir::run_plan_location(root) else {
        return Default::default();
    };
    let Ok((loaded, _)) = crate::plan::load_plan_based(&path, format, &base) else {
        return Default::default();
    };
    let stages = loaded.plan.stages.into_iter();
    stages.map(|s| (s.name, Kind::of(s.kind))).collect()
}

/// At most this many metrics of a command stage are shown on its row.
const COMMAND_SHOWN: usize = 6;

/// Whether a metric is an attempt's milestone time (`t_first_step`, …: Unix times, only
/// meaningful beside each other), kept in `report.json` and never shown as a result.
pub fn is_timing(name: &str) -> bool {
    name.starts_with("t_")
}

/// A metric's value as a person reads it: whole numbers whole, throughputs without decimals,
/// anything else with 4 decimals.
pub fn value_text(name: &str, v: f64) -> String {
    if name == "tokens_per_s" || (v.fract() == 0.0 && v.abs() < 1e15) {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
    }
}

/// A stage's headline metrics as `name=value` pairs, then `(+N more in report.json)` for the
/// others it reported (milestone times aside). A train stage shows its final loss and
/// throughput, an eval stage its accuracy and loss, a command stage what it reported (the usual
/// names first, at most [`COMMAND_SHOWN`]).
pub fn headline_text(kind: Kind, metrics: &BTreeMap<String, f64>) -> String {
    const USUAL: [&str; 5] = [
        "final_loss",
        "loss",
        "accuracy",
        "perplexity",
        "tokens_per_s",
    ];
    let results: Vec<&String> = metrics.keys().filter(|k| !is_timing(k)).collect();
    let shown: Vec<&String> = match kind.headline() {
        [] => {
            let mut keys = results.clone();
            keys.sort_by_key(|k| USUAL.iter().position(|f| f == k).unwrap_or(USUAL.len()));
            keys.truncate(COMMAND_SHOWN);
            keys
        }
        first => first
            .iter()
            .filter_map(|f| results.iter().find(|k| k.as_str() == *f).copied())
            .collect(),
    };
    let mut parts: Vec<String> = shown
        .iter()
        .map(|k| format!("{k}={}", value_text(k, metrics[*k])))
        .collect();
    let rest = results.len() - shown.len();
    if rest > 0 {
        parts.push(format!("(+{rest} more in report.json)"));
    }
    parts.join(" ")
}

/// One row of the table: the stage's record, its kind, and whether its metrics are already on
/// the console (a matrix instance, listed in the results table above).
pub struct Row {
    /// The stage's record.
    pub stage: StageReport,
    /// Its kind.
    pub kind: Kind,
    /// Whether its metrics were shown in the results table.
    pub in_results: bool,
}

/// The table's text: a header and a row per stage, the name, status, tries and wall columns
/// each as wide as its widest cell (so every status lines up), then the result: the error, or
/// the headline metrics (none for a matrix instance whose metrics the results table shows),
/// and each GPU's verdict.
pub fn render(rows: &[Row]) -> String {
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            let s = &r.stage;
            let wall = s
                .wall_s
                .map(|w| human_wall(Duration::from_secs_f64(w)))
                .unwrap_or_else(|| "-".into());
            let mut result = match &s.error {
                Some(e) => e.clone(),
                None if r.in_results => String::new(),
                None => headline_text(r.kind, &s.metrics),
            };
            for g in &s.gpu {
                result.push_str(&format!(
                    " [{} {}: {:.1} ms]",
                    &g.uuid[..g.uuid.len().min(12)],
                    g.verdict,
                    g.reclaim_ms
                ));
            }
            [
                s.name.clone(),
                s.status.as_str().to_string(),
                s.attempts.to_string(),
                wall,
                result.trim_start().to_string(),
            ]
        })
        .collect();
    let header = ["stage", "status", "try", "wall", "result"];
    let width =
        |i: usize| crate::table::column_width(header[i], cells.iter().map(|c| c[i].as_str()));
    let (w0, w1, w2, w3) = (width(0), width(1), width(2), width(3));
    let line = |c: [&str; 5]| {
        let text = format!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {:>w3$}  {}",
            c[0], c[1], c[2], c[3], c[4]
        );
        format!("{}\n", text.trim_end())
    };
    let mut out = format!("\n{}", line(header));
    for c in &cells {
        out.push_str(&line([&c[0], &c[1], &c[2], &c[3], &c[4]]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::status::StageStatus;

    fn stage(name: &str, status: StageStatus, metrics: &[(&str, f64)]) -> StageReport {
        let mut s = crate::report::empty_stage(name, std::path::Path::new("/r"));
        s.status = status;
        s.attempts = 1;
        s.wall_s = Some(1.5);
        s.metrics = metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        s
    }

    #[test]
    fn every_status_lines_up_and_each_kind_shows_its_headline_first() {
        let statuses = [
            StageStatus::Succeeded,
            StageStatus::Failed,
            StageStatus::Skipped,
            StageStatus::Cancelled,
            StageStatus::Interrupted,
            StageStatus::Running,
            StageStatus::Pending,
        ];
        let mut rows: Vec<Row> = statuses
            .iter()
            .enumerate()
            .map(|(i, st)| Row {
                stage: stage(&format!("s{i}"), *st, &[]),
                kind: Kind::Command,
                in_results: false,
            })
            .collect();
        rows.push(Row {
            stage: stage(
                "pretrain",
                StageStatus::Succeeded,
                &[
                    ("parameters", 462336.0),
                    ("final_loss", 1.25),
                    ("tokens_per_s", 81234.7),
                    ("t_first_step", 1.7e9),
                    ("first_loss", 5.5),
                ],
            ),
            kind: Kind::Train,
            in_results: false,
        });
        let text = render(&rows);
        let lines: Vec<&str> = text.lines().skip(2).collect();
        assert_eq!(lines.len(), 8, "{text}");
        // The wall column starts at the same place on every row, whatever the status.
        let ends: Vec<usize> = lines.iter().map(|l| l.find("1.5s").expect(l)).collect();
        assert!(ends.windows(2).all(|w| w[0] == w[1]), "{text}");
        assert!(
            text.contains("final_loss=1.2500 tokens_per_s=81235 (+2 more in report.json)"),
            "{text}"
        );
        assert!(!text.contains("t_first_step"), "{text}");
    }

    #[test]
    fn an_eval_shows_accuracy_then_loss_and_a_command_what_it_reported() {
        let m: BTreeMap<String, f64> = [("perplexity", 3.0), ("loss", 1.1), ("accuracy", 0.75)]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        assert_eq!(
            headline_text(Kind::Eval, &m),
            "accuracy=0.7500 loss=1.1000 (+1 more in report.json)"
        );
        assert_eq!(
            headline_text(Kind::Command, &m),
            "loss=1.1000 accuracy=0.7500 perplexity=3"
        );
    }
}
