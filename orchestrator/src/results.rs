//! The results table of a sweep: one row per matrix instance with its values, status and final
//! metrics, written as `results.csv` and `results.json` in the run directory and shown at the
//! end of the run.

use crate::plan::LoadedPlan;
use protocol::report::Report;
use std::collections::BTreeSet;

/// One row: column name and value, in column order.
pub type Row = Vec<(String, serde_json::Value)>;

/// The rows: `stage`, `instance`, each matrix key, `status`, `error`, then every metric (as
/// `metric.NAME` when a column of that name already exists).
/// `None` when the plan has no matrix stage.
pub fn rows(plan: &LoadedPlan, report: &Report) -> Option<Vec<Row>> {
    let mut rows = Vec::new();
    for (i, origin) in plan.instances.iter().enumerate() {
        let (Some(origin), Some(stage)) = (origin, report.stages.get(i)) else {
            continue;
        };
        let mut row: Row = vec![
            ("stage".into(), origin.base.clone().into()),
            ("instance".into(), stage.name.clone().into()),
        ];
        for (k, v) in &origin.values {
            row.push((k.clone(), v.clone().into()));
        }
        row.push(("status".into(), stage.status.clone().into()));
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
        rows.push(row);
    }
    (!rows.is_empty()).then_some(rows)
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

/// The rows as JSON objects.
pub fn to_json(rows: &[Row]) -> serde_json::Value {
    rows.iter()
        .map(|row| serde_json::Value::Object(row.iter().cloned().collect()))
        .collect()
}

fn get<'a>(row: &'a Row, key: &str) -> Option<&'a serde_json::Value> {
    row.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// The rows as CSV, with the union of all columns in the order they first appear.
pub fn to_csv(rows: &[Row]) -> String {
    let mut columns: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for row in rows {
        for (key, _) in row {
            if seen.insert(key.clone()) {
                columns.push(key.clone());
            }
        }
    }
    let mut out = columns.join(",");
    out.push('\n');
    for row in rows {
        let line: Vec<String> = columns
            .iter()
            .map(|c| get(row, c).map(csv_field).unwrap_or_default())
            .collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    out
}

/// Rows shown in full on the console; past this, only the rows that did not succeed are
/// listed (results.csv has every row).
pub const TABLE_ROWS: usize = 40;

/// A console table: instance, status, and the metrics each instance reported (the usual ones
/// first). A sweep of more than [`TABLE_ROWS`] instances shows only those that did not
/// succeed, and a count of the rest.
pub fn to_table(rows: &[Row]) -> String {
    let long = rows.len() > TABLE_ROWS;
    let instances = rows
        .iter()
        .filter_map(|r| get(r, "instance").and_then(|v| v.as_str()));
    let width = crate::table::column_width("instance", instances);
    let mut out = format!("\n{:<width$}  {:<10} results\n", "instance", "status");
    let mut hidden = 0usize;
    for row in rows {
        let text = |k: &str| {
            get(row, k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        };
        if long && text("status") == "succeeded" {
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
