//! Loading and validating plans.
//!
//! A plan is read from TOML (users) or JSON (programs) into [`protocol::plan::Plan`], then
//! checked as a whole: stage names, dependencies and cycles, `kind`/`command`, `init`, built-in
//! `params`, placeholders, `env`, `outputs`, limits. Problems come back as a [`PlanError`]
//! holding one [`Diagnostic`] per problem, each naming the file, the line and column (or the
//! stage) and what to do. Nothing in here panics on any input.
//!
//! Positions come from a second reading of the text into a spanned tree (see `tree`), since
//! the typed plan keeps none.

mod by_stage;
mod decode;
mod diagnostic;
mod expect;
mod explain;
mod files;
pub mod fingerprint;
mod graph;
mod json_tree;
mod layout;
pub mod matrix;
mod params;
pub(crate) mod placeholder;
mod plain_stage;
mod preload;
mod process;
mod sections;
mod serde_message;
mod suggest;
mod toml_tree;
mod tree;
mod validate;

pub use diagnostic::{Diagnostic, PlanError};
pub use params::SYNTHETIC_DATA;
pub use validate::{MAX_GPUS, MAX_NAME_LEN, RESERVED_ENV_PREFIX};

use diagnostic::Reporter;
use protocol::plan::{Plan, Stage};
pub use protocol::run::PlanFormat;
use std::path::{Path, PathBuf};

/// Plans larger than this are refused before parsing.
pub(crate) const MAX_PLAN_BYTES: u64 = 16 << 20;

/// A plan that passed every check, with its dependency graph worked out.
#[derive(Debug, Clone)]
pub struct LoadedPlan {
    /// The plan as decoded (defaults applied).
    pub plan: Plan,
    /// The plan's file as the user gave it, for messages.
    pub source_name: String,
    /// The absolute directory of the plan file: stages run there, and relative paths in the
    /// plan are relative to it.
    pub base_dir: PathBuf,
    /// Every stage index once, each after all of its upstreams; among stages that could go
    /// next, the one written first in the plan comes first.
    pub order: Vec<usize>,
    /// Per stage: the indices of the stages its `after` names, in that order.
    pub upstream: Vec<Vec<usize>>,
    /// Per stage: the indices of the stages that name it in `after`, in increasing order.
    pub downstream: Vec<Vec<usize>>,
    /// Per stage: the matrix stage and values it is an instance of (`None`: no matrix).
    pub instances: Vec<Option<matrix::Instance>>,
    /// Every stage index, sorted by the stage's name: a lookup by name without a second copy
    /// of every name (4 bytes a stage).
    by_name: Vec<u32>,
}

impl LoadedPlan {
    /// The index of the stage called `name` (names are unique in a loaded plan).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        let stages = &self.plan.stages;
        let at = self
            .by_name
            .binary_search_by(|&i| stages[i as usize].name.as_str().cmp(name))
            .ok()?;
        Some(self.by_name[at] as usize)
    }

    /// Stage `i` as it runs: a matrix instance with its `ORCHESTRATE_MATRIX_*` variables in
    /// its `env` (stored apart, see [`matrix::matrix_env`]); other stages as they are.
    pub(crate) fn stage_as_run(&self, i: usize) -> std::borrow::Cow<'_, Stage> {
        let stage = &self.plan.stages[i];
        match self.env_as_run(i) {
            std::borrow::Cow::Owned(env) => std::borrow::Cow::Owned(Stage {
                env,
                ..stage.clone()
            }),
            std::borrow::Cow::Borrowed(_) => std::borrow::Cow::Borrowed(stage),
        }
    }

    /// Stage `i`'s `env` as it runs (what [`Self::stage_as_run`] is made from), without copying
    /// the rest of the stage (a sweep plans thousands of attempts).
    pub(crate) fn env_as_run(
        &self,
        i: usize,
    ) -> std::borrow::Cow<'_, std::collections::BTreeMap<String, String>> {
        let env = &self.plan.stages[i].env;
        match self.instances.get(i).and_then(Option::as_ref) {
            Some(instance) if !instance.values.is_empty() => {
                let mut env = env.clone();
                env.extend(matrix::matrix_env(instance));
                std::borrow::Cow::Owned(env)
            }
            _ => std::borrow::Cow::Borrowed(env),
        }
    }

    /// The plan as run (every stage as [`Self::stage_as_run`] gives it), serialized one stage
    /// at a time.
    pub(crate) fn as_run(&self) -> impl serde::Serialize + '_ {
        AsRun(self)
    }
}

struct AsRun<'a>(&'a LoadedPlan);

impl serde::Serialize for AsRun<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Stages<'a>(&'a LoadedPlan);
        impl serde::Serialize for Stages<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer
                    .collect_seq((0..self.0.plan.stages.len()).map(|i| self.0.stage_as_run(i)))
            }
        }
        let mut plan = serializer.serialize_struct("Plan", 2)?;
        plan.serialize_field("run", &self.0.plan.run)?;
        plan.serialize_field("stage", &Stages(self.0))?;
        plan.end()
    }
}

/// Reads and validates the plan file at `path`: JSON if its extension is `.json`, else TOML.
///
/// A file that cannot be read (missing, not a regular file: a directory, a FIFO, a device;
/// not UTF-8, over `MAX_PLAN_BYTES`), read without blocking and never past that limit,
/// gives a single diagnostic that names it.
pub fn load_plan(path: &Path) -> Result<LoadedPlan, PlanError> {
    read_plan(path).map(|(plan, _)| plan)
}

/// [`load_plan`], also returning the text it read (what a run directory keeps).
pub fn read_plan(path: &Path) -> Result<(LoadedPlan, String), PlanError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let base_dir = std::fs::canonicalize(&dir).unwrap_or(dir);
    load_plan_based(path, format_of(path), &base_dir)
}

/// The format of the plan file at `path`: JSON if its extension is `.json`, else TOML.
pub fn format_of(path: &Path) -> PlanFormat {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
    {
        PlanFormat::Json
    } else {
        PlanFormat::Toml
    }
}

/// Reads and validates the plan file at `path` in `format`, its relative paths meaning paths
/// under `base_dir` (a run directory's copy of a plan is based where the original was).
/// Returns the plan and the text it was read from.
pub fn load_plan_based(
    path: &Path,
    format: PlanFormat,
    base_dir: &Path,
) -> Result<(LoadedPlan, String), PlanError> {
    let source_name = path.display().to_string();
    let source = read_source(path, &source_name)?;
    let plan = match format {
        PlanFormat::Json => parse_plan_json(&source, &source_name, base_dir),
        PlanFormat::Toml => parse_plan_toml(&source, &source_name, base_dir),
    }?;
    Ok((plan, source))
}

fn read_source(path: &Path, source_name: &str) -> Result<String, PlanError> {
    let fail = |why: String| PlanError {
        diagnostics: vec![Diagnostic {
            source_name: String::new(),
            line: None,
            column: None,
            stage: None,
            message: format!("cannot read plan `{source_name}`: {why}"),
            help: None,
        }],
    };
    let bytes =
        crate::store::user_file::read_regular(path, MAX_PLAN_BYTES).map_err(|e| match e {
            crate::store::user_file::UserFileError::TooLarge { .. } => fail(format!(
                "it is more than a plan may be ({MAX_PLAN_BYTES} bytes)"
            )),
            other => fail(other.to_string()),
        })?;
    String::from_utf8(bytes).map_err(|e| {
        let good = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        // The prefix is valid UTF-8 by construction.
        let text = std::str::from_utf8(good).unwrap_or_default();
        let (line, column) = diagnostic::LineIndex::new(text).position(text.len());
        fail(format!(
            "it is not UTF-8 text (line {line}, column {column})"
        ))
    })
}

/// Validates a plan given as TOML text. `source_name` names it in messages; `base_dir` is the
/// directory stages run in (made absolute against the current directory if it is relative).
///
/// A long written-out plan is decoded one stage at a time, so that its whole parsed document is
/// never held at once; any problem in it is then found and explained by reading it whole.
pub fn parse_plan_toml(
    source: &str,
    source_name: &str,
    base_dir: &Path,
) -> Result<LoadedPlan, PlanError> {
    if let Some(plan) = by_stage::decode(source) {
        let rep = Reporter::new(source, source_name);
        if let Ok(loaded) = finish(Some(plan), None, rep, source_name, base_dir) {
            return Ok(loaded);
        }
    }
    let document = toml_edit::ImDocument::parse(source).ok();
    let tree = document.as_ref().map(toml_tree::of_document);
    let mut rep = Reporter::new(source, source_name);
    let plan = decode::toml_plan(source, document, tree.as_ref(), &mut rep);
    finish(plan, tree.as_ref(), rep, source_name, base_dir)
}

/// Validates a plan given as JSON text (the same format, as a JSON object); see
/// [`parse_plan_toml`]. A leading byte-order mark is skipped, as a TOML plan's is.
pub fn parse_plan_json(
    source: &str,
    source_name: &str,
    base_dir: &Path,
) -> Result<LoadedPlan, PlanError> {
    let source = source.strip_prefix('\u{feff}').unwrap_or(source);
    let tree = json_tree::from_json(source);
    let mut rep = Reporter::new(source, source_name);
    for duplicate in tree.iter().flat_map(json_tree::duplicate_keys) {
        let first = duplicate
            .first
            .map(|span| format!(" (first at line {})", rep.line_of(span.start)))
            .unwrap_or_default();
        rep.error(
            duplicate.again,
            None,
            format!(
                "`{}` is given twice in one object{first}; a JSON plan names each key once",
                duplicate.key
            ),
            Some("remove one of them (TOML plans refuse a repeated key too)".into()),
        );
    }
    let plan = decode::json_plan(source, tree.as_ref(), &mut rep);
    finish(plan, tree.as_ref(), rep, source_name, base_dir)
}

fn finish(
    plan: Option<Plan>,
    tree: Option<&tree::Node>,
    mut rep: Reporter,
    source_name: &str,
    base_dir: &Path,
) -> Result<LoadedPlan, PlanError> {
    let graph = plan
        .as_ref()
        .and_then(|plan| validate::check(plan, tree, &mut rep));
    let absolute = std::path::absolute(base_dir).unwrap_or_else(|_| base_dir.to_path_buf());
    if let Some(plan) = &plan {
        files::check(plan, &absolute, &mut rep);
    }
    if let Some(error) = rep.finish() {
        return Err(error);
    }
    let (Some(plan), Some(graph)) = (plan, graph) else {
        // Unreachable in practice: no plan or no graph always comes with a diagnostic.
        return Err(PlanError {
            diagnostics: vec![Diagnostic {
                source_name: source_name.to_string(),
                line: None,
                column: None,
                stage: None,
                message: "the plan could not be read".into(),
                help: None,
            }],
        });
    };
    let base_dir = std::path::absolute(base_dir).unwrap_or_else(|_| base_dir.to_path_buf());
    let (plan, instances, order, upstream) = if plan.stages.iter().all(|s| s.matrix.is_empty()) {
        let n = plan.stages.len();
        (plan, vec![None; n], graph.order, graph.upstream)
    } else {
        let (plan, instances) = matrix::expand(plan, &base_dir, source_name)
            .map_err(|diagnostics| PlanError { diagnostics })?;
        let index: std::collections::HashMap<&str, usize> = plan
            .stages
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_str(), i))
            .collect();
        let upstream: Vec<Vec<usize>> = plan
            .stages
            .iter()
            .map(|s| {
                s.after
                    .iter()
                    .filter_map(|a| index.get(a.as_str()).copied())
                    .collect()
            })
            .collect();
        let order = graph::topological_order(&upstream).unwrap_or_default();
        (plan, instances, order, upstream)
    };
    let downstream = graph::invert(&upstream);
    // Fewer stages than u32 counts: 2^32 stages of a few hundred bytes each would not fit in
    // memory long before.
    let mut by_name: Vec<u32> = (0..plan.stages.len() as u32).collect();
    by_name.sort_unstable_by(|&a, &b| {
        plan.stages[a as usize]
            .name
            .cmp(&plan.stages[b as usize].name)
    });
    Ok(LoadedPlan {
        plan,
        source_name: source_name.to_string(),
        base_dir,
        order,
        upstream,
        downstream,
        instances,
        by_name,
    })
}

/// The JSON Schema of the plan format (what `orchestrate schema` prints).
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Plan)).unwrap_or(serde_json::Value::Null)
}

/// Linux refuses to start a program whose arguments and environment together exceed this
/// (`ARG_MAX`, "Argument list too long").
const ARG_MAX: usize = 2 << 20;
/// ... or any one of whose arguments or variables exceeds this (`MAX_ARG_STRLEN`).
const ARG_STRLEN_MAX: usize = 128 << 10;

/// A stage whose command line or environment comes near, or over, the kernel's limits on a
/// new process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSizeProblem {
    /// The stage cannot start as written (one argument or variable over `MAX_ARG_STRLEN`):
    /// `validate` fails.
    pub fatal: bool,
    /// What is wrong, naming the stage.
    pub text: String,
}

/// Stages whose command line and environment would come near the kernel's limits on a new
/// process (counting the environment `orchestrate` itself runs with, the contract's variables
/// and about 200 bytes per path it hands over): a warning each, so `validate` says so before
/// a run fails to start them; one argument or variable longer than the kernel takes for one
/// is fatal (the stage could never start).
pub fn launch_size_problems(plan: &LoadedPlan) -> Vec<LaunchSizeProblem> {
    let inherited: usize = std::env::vars_os()
        .map(|(k, v)| k.len() + v.len() + 2)
        .sum();
    let mut problems = Vec::new();
    for i in 0..plan.plan.stages.len() {
        let stage = plan.stage_as_run(i);
        let inputs = plan.upstream[i].len().min(protocol::worker::MAX_INPUT_VARS);
        let argv: usize = stage
            .command
            .iter()
            .flatten()
            .map(|a| a.len() + 200 * a.matches('{').count() + 1)
            .sum();
        let env: usize = stage.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
        let total = inherited + argv + env + 2048 + 200 * inputs;
        // The kernel's limit is on each string it copies: an argument, or `NAME=value`.
        let longest = stage
            .command
            .iter()
            .flatten()
            .map(|a| a.len() + 1)
            .chain(stage.env.iter().map(|(k, v)| k.len() + v.len() + 2))
            .max()
            .unwrap_or(0);
        if longest > ARG_STRLEN_MAX {
            problems.push(LaunchSizeProblem {
                fatal: true,
                text: format!(
                    "stage `{}`: one of its arguments or variables is {} KiB; Linux refuses to start a program with one longer than {} KiB (\"Argument list too long\"): pass it in a file instead",
                    stage.name,
                    longest >> 10,
                    ARG_STRLEN_MAX >> 10
                ),
            });
        } else if total > ARG_MAX / 2 {
            problems.push(LaunchSizeProblem {
                fatal: false,
                text: format!(
                    "stage `{}`: its command line and environment take about {} KiB; Linux refuses to start a program with more than {} KiB (\"Argument list too long\")",
                    stage.name,
                    total >> 10,
                    ARG_MAX >> 10
                ),
            });
        } else if longest > ARG_STRLEN_MAX / 2 {
            problems.push(LaunchSizeProblem {
                fatal: false,
                text: format!(
                    "stage `{}`: one of its arguments or variables is {} KiB; Linux refuses any longer than {} KiB",
                    stage.name,
                    longest >> 10,
                    ARG_STRLEN_MAX >> 10
                ),
            });
        }
    }
    problems
}

#[cfg(test)]
mod env_as_run_tests {
    #[test]
    fn env_as_run_is_the_env_of_the_stage_as_run() {
        let text = "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\nenv = { X = \"1\" }\n\
                    matrix = { i = [1, 2] }\n\
                    [[stage]]\nname = \"b\"\ncommand = [\"true\"]\nenv = { Y = \"2\" }\n";
        let plan = super::parse_plan_toml(text, "t.toml", std::path::Path::new("/")).unwrap();
        assert_eq!(plan.plan.stages.len(), 3);
        for i in 0..plan.plan.stages.len() {
            assert_eq!(*plan.env_as_run(i), plan.stage_as_run(i).env, "stage {i}");
        }
        let a2 = plan.index_of("a[i=2]").unwrap();
        assert_eq!(plan.env_as_run(a2)["ORCHESTRATE_MATRIX_I"], "2");
        assert_eq!(plan.env_as_run(a2)["X"], "1");
        let a2_as_run = plan.stage_as_run(a2);
        assert_eq!(a2_as_run.env["ORCHESTRATE_MATRIX_I"], "2");
        assert_eq!(a2_as_run.name, plan.plan.stages[a2].name);
        let b = plan.index_of("b").unwrap();
        assert!(matches!(
            plan.stage_as_run(b),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
