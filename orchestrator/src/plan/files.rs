//! The files a plan names exist: a matrix axis's `lines` file or `glob` (which must match
//! something) and a built-in stage's `data` file. Checked with the other problems, so one
//! `validate` lists them all instead of a run stopping at the first missing file.

use super::diagnostic::Reporter;
use super::matrix::axis_values;
use protocol::plan::{MatrixAxis, Plan};
use std::path::Path;

/// Reports every named file that cannot be found or read, by stage.
pub(crate) fn check(plan: &Plan, base_dir: &Path, rep: &mut Reporter) {
    for stage in &plan.stages {
        for (key, axis) in &stage.matrix {
            if matches!(axis, MatrixAxis::Values(_)) {
                continue;
            }
            match axis_values(axis, base_dir) {
                Err(why) => rep.error(
                    None,
                    Some(&stage.name),
                    format!("matrix key `{key}`: {why}"),
                    Some(format!(
                        "paths in a plan are relative to its directory, {}",
                        base_dir.display()
                    )),
                ),
                Ok(values) if values.is_empty() => rep.error(
                    None,
                    Some(&stage.name),
                    match axis {
                        MatrixAxis::Glob { glob } => {
                            format!("matrix key `{key}`: `{glob}` matches no file")
                        }
                        _ => format!("matrix key `{key}`: the file has no value lines"),
                    },
                    None,
                ),
                Ok(_) => {}
            }
        }
        if stage.kind.is_none() {
            continue;
        }
        let Some(data) = stage.params.get("data").and_then(|d| d.as_str()) else {
            continue;
        };
        if data.starts_with("synthetic:") || data.contains("{matrix.") {
            continue;
        }
        let path = base_dir.join(data);
        if !path.is_file() {
            rep.error(
                None,
                Some(&stage.name),
                format!(
                    "params.data `{data}`: {} is not a file",
                    path.display()
                ),
                Some("a built-in stage reads plain text or JSONL from a file relative to the plan's directory, or `synthetic:pretrain` / `synthetic:sft`".into()),
            );
        }
    }
}
