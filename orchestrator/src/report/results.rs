//! The results of a sweep, written in the run directory and shown at the end of the run:
//! `results.json` has one row per matrix instance with its values, status and final metrics;
//! `results.csv` one row per sample (one combination of matrix values), joining the instances
//! of every matrix stage that ran on it, so a fine-tune and its evaluation read as one line.
//! Neither carries the `t_*` timing metrics (`report.json` does), and whole numbers are written
//! as integers.

use crate::plan::LoadedPlan;
use protocol::report::StageReport;
use protocol::status::StageStatus;
use std::collections::BTreeSet;
use std::io::Write as _;

/// One row: column name and value, in column order.
pub type Row = Vec<(String, serde_json::Value)>;

/// Instance `i`'s row: `stage`, `instance`, each matrix key, `status`, `node` (only where it ran
/// as a Slurm job step: its first task's node), `error`, then every metric but the `t_*`
/// timings (as `metric.NAME` when a column of that name already exists). `None` for a stage
/// that is not a matrix instance.
pub fn row(plan: &LoadedPlan, i: usize, stage: &StageReport) -> Option<Row> {
    let origin = plan.instances.get(i)?.as_ref()?;
    let mut row: Row = vec![
        ("stage".into(), origin.base.to_string().into()),
        ("instance".into(), stage.name.clone().into()),
    ];
    for (k, v) in &origin.values {
        row.push((k.to_string(), v.clone().into()));
    }
    push_outcome(&mut row, "", stage);
    Some(row)
}

/// Appends `stage`'s `status`, `node` (where it ran as a Slurm job step: its first task's
/// node), `error` and metrics to `row`, each column named `PREFIX` + its name; a metric whose
/// column already exists (a matrix key, a fixed column) is named `PREFIX` + `metric.NAME`.
fn push_outcome(row: &mut Row, prefix: &str, stage: &StageReport) {
    row.push((format!("{prefix}status"), stage.status.as_str().into()));
    if let Some(task) = stage.tasks.first() {
        row.push((format!("{prefix}node"), task.node.clone().into()));
    }
    row.push((
        format!("{prefix}error"),
        stage.error.clone().unwrap_or_default().into(),
    ));
    for (k, v) in stage.metrics.iter().filter(|(k, _)| !is_timing(k)) {
        let name = format!("{prefix}{k}");
        let name = if row.iter().any(|(c, _)| *c == name) {
            format!("{prefix}metric.{k}")
        } else {
            name
        };
        row.push((name, number(*v)));
    }
}

/// Whether a metric is one of the worker's internal timings (`t_model_ready`, …): Unix times
/// that mean something only beside each other, kept in `report.json`.
fn is_timing(metric: &str) -> bool {
    metric.starts_with("t_")
}

/// A metric as JSON: a whole number (within the range a double holds exactly) as an integer,
/// anything else as it is.
fn number(v: f64) -> serde_json::Value {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if v.fract() == 0.0 && v.abs() < EXACT {
        (v as i64).into()
    } else {
        v.into()
    }
}

/// The samples of the plan: each distinct combination of matrix values, in the order of its
/// first instance, with the indices of the instances (of every matrix stage) that ran on it.
fn samples(plan: &LoadedPlan) -> Vec<Vec<usize>> {
    let mut index: std::collections::HashMap<&[(std::sync::Arc<str>, String)], usize> =
        std::collections::HashMap::new();
    let mut samples: Vec<Vec<usize>> = Vec::new();
    for (i, origin) in plan.instances.iter().enumerate() {
        let Some(origin) = origin else { continue };
        let n = *index.entry(&origin.values).or_insert_with(|| {
            samples.push(Vec::new());
            samples.len() - 1
        });
        samples[n].push(i);
    }
    samples
}

/// Whether the plan has instances of more than one matrix stage.
fn several_stages(plan: &LoadedPlan) -> bool {
    let mut bases = plan.instances.iter().flatten().map(|o| &o.base);
    let first = bases.next();
    bases.any(|b| Some(b) != first)
}

/// One sample's CSV row: each matrix key, then each of its instances' outcome. With instances
/// of more than one matrix stage (`prefixed`) the columns of each are prefixed with its stage
/// name (`finetune.status`, `eval.accuracy`); a plan with one matrix stage keeps plain names.
fn sample_row(
    plan: &LoadedPlan,
    sample: &[usize],
    prefixed: bool,
    report: &dyn Fn(usize) -> StageReport,
) -> Row {
    let mut row: Row = Vec::new();
    for &i in sample {
        let Some(origin) = &plan.instances[i] else {
            continue;
        };
        for (k, v) in &origin.values {
            if !row.iter().any(|(c, _)| c.as_str() == &**k) {
                row.push((k.to_string(), v.clone().into()));
            }
        }
    }
    for &i in sample {
        let Some(origin) = &plan.instances[i] else {
            continue;
        };
        let prefix = if prefixed {
            format!("{}.", origin.base)
        } else {
            String::new()
        };
        push_outcome(&mut row, &prefix, &report(i));
    }
    row
}

/// Writes `row` as one JSON object, its keys in column order (their names are unique).
fn write_object(out: &mut dyn std::io::Write, row: &Row) -> std::io::Result<()> {
    out.write_all(b"{")?;
    for (n, (key, value)) in row.iter().enumerate() {
        if n > 0 {
            out.write_all(b",")?;
        }
        serde_json::to_writer(&mut *out, key).map_err(std::io::Error::other)?;
        out.write_all(b":")?;
        serde_json::to_writer(&mut *out, value).map_err(std::io::Error::other)?;
    }
    out.write_all(b"}")
}

/// Whether the plan has matrix instances (and so a results table).
pub fn has_rows(plan: &LoadedPlan) -> bool {
    plan.instances.iter().any(Option::is_some)
}

/// Writes `results.csv` and `results.json` into `dir` and returns the console table, taking
/// the rows one at a time from `report` (stage index → record): memory stays flat however
/// many instances there are. Each file is replaced atomically (see
/// [`crate::store::rundir::write_replace`]).
pub fn write(
    plan: &LoadedPlan,
    report: &dyn Fn(usize) -> StageReport,
    dir: &std::path::Path,
) -> std::io::Result<String> {
    let rows = || {
        (0..plan.plan.stages.len()).filter_map(|i| {
            plan.instances[i].as_ref()?;
            row(plan, i, &report(i))
        })
    };
    // One pass writes results.json (a JSON array, one row per line) and collects the console
    // table's rows; then results.csv, whose header needs every sample row's columns first.
    let mut total = 0usize;
    let mut shown: Vec<Row> = Vec::new();
    crate::store::rundir::write_replace_with(&dir.join("results.json"), |out| {
        out.write_all(b"[")?;
        for row in rows() {
            out.write_all(if total == 0 { b"\n" } else { b",\n" })?;
            total += 1;
            write_object(&mut *out, &row)?;
            if shown.len() < TABLE_ROWS || !succeeded(&row) {
                shown.push(row);
            }
        }
        out.write_all(b"\n]\n")
    })?;
    // The CSV's columns: every sample row's, in the order they first appear.
    let samples = samples(plan);
    let prefixed = several_stages(plan);
    let mut columns: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for sample in &samples {
        for (key, _) in sample_row(plan, sample, prefixed, report) {
            if seen.insert(key.clone()) {
                columns.push(key);
            }
        }
    }
    crate::store::rundir::write_replace_with(&dir.join("results.csv"), |out| {
        writeln!(out, "{}", columns.join(","))?;
        for row in samples
            .iter()
            .map(|s| sample_row(plan, s, prefixed, report))
        {
            let line: Vec<String> = columns
                .iter()
                .map(|c| get(&row, c).map(csv_field).unwrap_or_default())
                .collect();
            writeln!(out, "{}", line.join(","))?;
        }
        Ok(())
    })?;
    Ok(to_table(&shown, total))
}

/// Whether the row's stage succeeded.
fn succeeded(row: &Row) -> bool {
    text(row, "status") == StageStatus::Succeeded.as_str()
}

fn text<'a>(row: &'a Row, key: &str) -> &'a str {
    get(row, key).and_then(|v| v.as_str()).unwrap_or("")
}

fn csv_field(value: &serde_json::Value) -> String {
    let text = match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    };
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

fn get<'a>(row: &'a Row, key: &str) -> Option<&'a serde_json::Value> {
    row.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// Rows shown in full on the console; past this, only the rows that did not succeed are
/// listed (results.csv has every row).
pub const TABLE_ROWS: usize = 40;

/// A console table: instance, status, and the metrics each instance reported (the usual ones
/// first). A sweep of more than [`TABLE_ROWS`] instances shows only those that did not
/// succeed, and a count of the rest.
/// `rows` are the first [`TABLE_ROWS`] rows and every later one that did not succeed, of
/// `total` in all.
fn to_table(rows: &[Row], total: usize) -> String {
    let long = total > TABLE_ROWS;
    let instances = rows
        .iter()
        .filter_map(|r| get(r, "instance").and_then(|v| v.as_str()));
    let width = crate::table::column_width("instance", instances);
    let mut out = format!("\n{:<width$}  {:<10} results\n", "instance", "status");
    let mut hidden = total - rows.len();
    for row in rows {
        let text = |k: &str| {
            get(row, k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        };
        if long && succeeded(row) {
            hidden += 1;
            continue;
        }
        // Metric columns come after `error`.
        let metrics: std::collections::BTreeMap<String, f64> = row
            .iter()
            .skip_while(|(k, _)| k != "error")
            .skip(1)
            .filter_map(|(k, v)| v.as_f64().map(|v| (k.clone(), v)))
            .collect();
        let detail = if text("error").is_empty() {
            crate::report::metrics_text(&metrics)
        } else {
            text("error")
        };
        out.push_str(&format!(
            "{:<width$}  {:<10} {detail}\n",
            text("instance"),
            text("status")
        ));
    }
    if hidden > 0 {
        out.push_str(&format!(
            "… and {hidden} more instances that succeeded (every row is in results.csv)\n"
        ));
    }
    out
}
