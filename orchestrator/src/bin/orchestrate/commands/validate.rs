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
