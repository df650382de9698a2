//! `orchestrate validate` and `orchestrate schema`.

use super::{load_or_report, print_json};
use orchestrator::exit;
use orchestrator::plan::LoadedPlan;
use orchestrator::settings::Settings;
use std::path::Path;
use std::process::ExitCode;

/// `orchestrate validate PLAN`: exit 0 and one line, or 2 with every problem found.
pub(crate) fn validate(plan: &Path) -> ExitCode {
    let loaded = match load_or_report(plan) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let problems = orchestrator::plan::launch_size_problems(&loaded);
    for problem in &problems {
        let kind = if problem.fatal { "error" } else { "warning" };
        eprintln!("{}: {kind}: {}", plan.display(), problem.text);
    }
    if problems.iter().any(|p| p.fatal) {
        return ExitCode::from(exit::INVALID_INPUT as u8);
    }
    if let Some(refusal) =
        orchestrator::run::preflight::host_limits_refusal(&loaded, &Settings::from_env())
    {
        eprintln!("{}: error: {refusal}", plan.display());
        return ExitCode::from(exit::INVALID_INPUT as u8);
    }
    for warning in no_gpu_warnings(&loaded) {
        eprintln!("{}: warning: {warning}", plan.display());
    }
    println!(
        "{}: ok ({} stage{}; order: {})",
        plan.display(),
        loaded.plan.stages.len(),
        if loaded.plan.stages.len() == 1 {
            ""
        } else {
            "s"
        },
        order_text(&loaded)
    );
    ExitCode::SUCCESS
}

/// On a machine with GPUs: one warning per command stage (a matrix stage once) that gets none
/// because it does not set `gpus` (its `CUDA_VISIBLE_DEVICES` is empty, so a framework that
/// would use a GPU trains on the CPU without an error).
fn no_gpu_warnings(loaded: &LoadedPlan) -> Vec<String> {
    let gpus = orchestrator::gpu::machine_gpu_count();
    if gpus == 0 {
        return Vec::new();
    }
    let mut named = std::collections::BTreeSet::new();
    loaded
        .plan
        .stages
        .iter()
        .enumerate()
        .filter(|(_, s)| s.command.is_some() && s.gpus.is_none())
        .filter_map(|(i, s)| {
            let base = loaded.instances[i]
                .as_ref()
                .map_or(s.name.clone(), |o| o.base.to_string());
            named.insert(base.clone()).then(|| {
                format!(
                    "stage `{base}` gets no GPU: a command stage without `gpus` runs with CUDA_VISIBLE_DEVICES empty on this machine's {gpus} GPU(s); set `gpus = 1` if it uses one, or `gpus = 0` to say it does not"
                )
            })
        })
        .collect()
}

/// `orchestrate schema`: the plan format's JSON Schema.
pub(crate) fn schema() -> ExitCode {
    let schema = orchestrator::plan::json_schema();
    print_json(&schema);
    ExitCode::SUCCESS
}

/// The order stages would start in, for `validate`: every stage of a small plan; the first
/// and last few of a sweep, with a count of those between.
fn order_text(loaded: &LoadedPlan) -> String {
    const ENDS: usize = 5;
    let name = |i: &usize| loaded.plan.stages[*i].name.as_str();
    let order = &loaded.order;
    if order.len() <= 4 * ENDS {
        return order.iter().map(name).collect::<Vec<_>>().join(" → ");
    }
    let head: Vec<&str> = order[..ENDS].iter().map(name).collect();
    let tail: Vec<&str> = order[order.len() - ENDS..].iter().map(name).collect();
    format!(
        "{} → … {} more … → {}",
        head.join(" → "),
        order.len() - 2 * ENDS,
        tail.join(" → ")
    )
}
