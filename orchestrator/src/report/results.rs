//! The results table of a sweep: one row per matrix instance with its values, status and final
//! metrics, written as `results.csv` and `results.json` in the run directory and shown at the
//! end of the run.

use crate::plan::LoadedPlan;
use protocol::report::StageReport;
use protocol::status::StageStatus;
use std::collections::BTreeSet;

/// One row: column name and value, in column order.
pub type Row = Vec<(String, serde_json::Value)>;

/// Instance `i`'s row: `stage`, `instance`, each matrix key, `status`, `node` (only where it ran
/// as a Slurm job step: its first task's node), `error`, then every
/// metric (as `metric.NAME` when a column of that name already exists). `None` for a stage
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
    row.push(("status".into(), stage.status.as_str().into()));
    // The node it ran on, where it ran as a job step (placed over an allocation, or srun).
    if let Some(task) = stage.tasks.first() {
        row.push(("node".into(), task.node.clone().into()));
    }
    row.push((
        "error".into(),
        stage.error.clone().unwrap_or_default().into(),
    ));
    for (k, v) in &stage.metrics {
        // A metric named like a matrix key (or a fixed column) keeps both apart.
        let name = if row.iter().any(|(c, _)| c == k) {
            format!("metric.{k}")
        } else {
            k.clone()
        };
        row.push((name, (*v).into()));
    }
    Some(row)
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
    // One pass writes results.json (a JSON array, one row per line) and collects the CSV's
    // columns (the union of every row's, in the order they first appear) and the console
    // table's rows; a second writes results.csv, whose header needs every column first.
    let mut columns: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    let mut total = 0usize;
    let mut shown: Vec<Row> = Vec::new();
    crate::store::rundir::write_replace_with(&dir.join("results.json"), |out| {
        out.write_all(b"[")?;
        for row in rows() {
            out.write_all(if total == 0 { b"\n" } else { b",\n" })?;
            total += 1;
            for (key, _) in &row {
                if seen.insert(key.clone()) {
                    columns.push(key.clone());
                }
            }
            write_object(&mut *out, &row)?;
            if shown.len() < TABLE_ROWS || !succeeded(&row) {
                shown.push(row);
            }
        }
        out.write_all(b"\n]\n")
    })?;
    crate::store::rundir::write_replace_with(&dir.join("results.csv"), |out| {
        writeln!(out, "{}", columns.join(","))?;
        for row in rows() {
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
