//! What a run's page needs to know of its stages beyond their events: each stage's kind
//! (`train`, `eval` or `command`: which metrics are its headline) and, for a matrix instance,
//! the stage it is an instance of and its matrix values (the page's labels and its per-sample
//! table). Read once per run from the plan copy in its directory, then kept.

use std::path::Path;

/// The stages of the run in `run_dir`, in plan order: `[{name, kind, base?, values?}]`, where
/// `values` is `[[key, value], …]` in key order. `None` when the plan copy cannot be read or
/// no longer loads (its relative paths gone): the page then shows names and every metric.
pub fn read(run_dir: &Path) -> Option<serde_json::Value> {
    let (path, format, base) = crate::store::rundir::run_plan_location(run_dir).ok()?;
    let (loaded, _) = crate::plan::load_plan_based(&path, format, &base).ok()?;
    let stages = loaded
        .plan
        .stages
        .iter()
        .zip(&loaded.instances)
        .map(|(stage, instance)| {
            let kind = stage.kind.map_or("command", |k| k.as_str());
            let mut meta = serde_json::json!({ "name": stage.name, "kind": kind });
            if let Some(instance) = instance {
                meta["base"] = instance.base.to_string().into();
                meta["values"] = instance
                    .values
                    .iter()
                    .map(|(k, v)| serde_json::json!([k.to_string(), v]))
                    .collect();
            }
            meta
        })
        .collect();
    Some(stages)
}
