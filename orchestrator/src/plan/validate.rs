//! The checks a decoded plan must pass before anything runs. All of them run, and every
//! problem found is reported, each pointing at the text it is about when positions are known.

use super::diagnostic::Reporter;
use super::graph;
use super::params::{self, ParamsAt};
use super::suggest;
use super::tree::Node;
use protocol::plan::{BuiltinKind, Plan, Stage};
use std::collections::{HashMap, HashSet};
use std::ops::Range;

/// The longest stage (or run) name, in characters.
pub const MAX_NAME_LEN: usize = 64;
/// The most GPUs one stage may ask for.
pub const MAX_GPUS: u32 = 64;
/// The prefix of the variables the orchestrator sets itself.
pub const RESERVED_ENV_PREFIX: &str = "ORCHESTRATE_";

/// The dependency graph of a plan that passed every check.
pub(crate) struct Graph {
    pub order: Vec<usize>,
    pub upstream: Vec<Vec<usize>>,
}

/// Runs every check; the graph when there was no problem.
pub(crate) fn check(plan: &Plan, tree: Option<&Node>, rep: &mut Reporter) -> Option<Graph> {
    let mut v = Validator {
        plan,
        tree,
        rep,
        first_of: HashMap::new(),
        variable_of: HashMap::new(),
        names: Vec::new(),
        guesses: 0,
    };
    v.check_run();
    if plan.stages.is_empty() {
        v.rep.error(
            None,
            None,
            "the plan has no stages",
            Some("add a `[[stage]]` table with a `name`, and a `kind` or a `command`".into()),
        );
    }
    for i in 0..plan.stages.len() {
        v.check_identity(i);
    }
    // Every input variable is checked: what the map holds is not needed past here.
    v.variable_of = HashMap::new();
    let upstream: Vec<Vec<usize>> = (0..plan.stages.len()).map(|i| v.check_after(i)).collect();
    // An order exists exactly when there is no cycle; only then is there none to look for.
    let order = graph::topological_order(&upstream);
    if order.is_none() {
        for cycle in graph::find_cycles(&upstream) {
            v.report_cycle(&cycle);
        }
    }
    for i in 0..plan.stages.len() {
        v.check_body(i, &upstream);
    }
    if !v.rep.diagnostics.is_empty() {
        return None;
    }
    Some(Graph {
        order: order?,
        upstream,
    })
}

pub(crate) struct Validator<'p, 'r, 's> {
    pub(super) plan: &'p Plan,
    tree: Option<&'p Node>,
    pub(super) rep: &'r mut Reporter<'s>,
    /// Each stage name and the first stage that has it.
    first_of: HashMap<&'p str, usize>,
    /// Each input variable (`ORCHESTRATE_INPUT_<NAME>`) and the first stage it names.
    variable_of: HashMap<String, usize>,
    /// The distinct stage names in plan order, for suggestions.
    names: Vec<&'p str>,
    /// How many "did you mean" searches were made: each compares with every name, so a plan
    /// of thousands of stages and thousands of wrong names stops guessing after a while.
    guesses: usize,
}

/// Why a name is not a good stage (or run) name, if it is not.
fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty".into());
    }
    if name == "." || name == ".." {
        return Some(format!("cannot be `{name}`"));
    }
    let len = name.chars().count();
    if len > MAX_NAME_LEN {
        return Some(format!(
            "is {len} characters long; the limit is {MAX_NAME_LEN}"
        ));
    }
    let bad = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))?;
    Some(format!("has a character that is not allowed: {bad:?}"))
}

impl<'p> Validator<'p, '_, '_> {
    pub(super) fn stage(&self, i: usize) -> &'p Stage {
        &self.plan.stages[i]
    }

    /// The stage's name for the diagnostic prefix (none for an empty name).
    pub(super) fn label(&self, i: usize) -> Option<&'p str> {
        Some(self.stage(i).name.as_str()).filter(|n| !n.is_empty())
    }

    pub(super) fn node(&self, i: usize) -> Option<&'p Node> {
        self.tree?.get("stage")?.at(i)
    }

    /// Span of the stage's table (its `[[stage]]` header in TOML).
    pub(super) fn stage_span(&self, i: usize) -> Option<Range<usize>> {
        self.node(i).and_then(|n| n.span.clone())
    }

    /// Span of the stage's `key` value, else of the stage.
    pub(super) fn field(&self, i: usize, key: &str) -> Option<Range<usize>> {
        self.node(i)
            .and_then(|n| n.get(key))
            .and_then(|n| n.span.clone())
            .or_else(|| self.stage_span(i))
    }

    /// Span of element `j` of the stage's `key` array, else of the array.
    pub(super) fn item(&self, i: usize, key: &str, j: usize) -> Option<Range<usize>> {
        self.node(i)
            .and_then(|n| n.get(key))
            .and_then(|n| n.at(j))
            .and_then(|n| n.span.clone())
            .or_else(|| self.field(i, key))
    }

    pub(super) fn error(
        &mut self,
        span: Option<Range<usize>>,
        i: usize,
        message: String,
        help: Option<String>,
    ) {
        let stage = self.label(i);
        self.rep.error(span, stage, message, help);
    }

    /// The stage called `name` (the first, if several are).
    pub(super) fn first_index(&self, name: &str) -> Option<usize> {
        self.first_of.get(name).copied()
    }

    /// The help for a name that is not a stage: a close one, and the list of stages.
    pub(super) fn stage_help(&mut self, wrong: &str) -> String {
        const MAX_GUESSES: usize = 100;
        self.guesses += 1;
        let guess = self.guesses <= MAX_GUESSES;
        suggest::help_maybe_guessing(wrong, &self.names, "stages are", guess)
    }

    fn check_run(&mut self) {
        let run = &self.plan.run;
        let run_field = |key: &str| {
            self.tree
                .and_then(|t| t.get("run"))
                .and_then(|r| r.get(key))
                .and_then(|n| n.span.clone())
        };
        if run.max_parallel == Some(0) {
            let span = run_field("max_parallel");
            self.rep.error(
                span,
                None,
                "`run.max_parallel` is 0, so no stage could ever start",
                Some("use 1 or more, or leave it out (the default is the number of CPUs)".into()),
            );
        }
        if let Some(problem) = run.name.as_deref().and_then(name_problem) {
            let span = run_field("name");
            self.rep.error(
                span,
                None,
                format!("`run.name` {problem}"),
                Some("the run's name goes into its directory's name: use letters, digits, `-`, `_` and `.`".into()),
            );
        }
        if run.worker.as_deref().is_some_and(|w| w.trim().is_empty()) {
            let span = run_field("worker");
            self.rep.error(
                span,
                None,
                "`run.worker` is empty",
                Some("give the path of the stage-worker binary, or leave it out".into()),
            );
        }
        let span = run_field("preload");
        self.check_run_preload(span);
    }

    /// The name: well formed and unique.
    fn check_identity(&mut self, i: usize) {
        let name = self.stage(i).name.as_str();
        let span = self.field(i, "name");
        if let Some(problem) = name_problem(name) {
            self.error(
                span.clone(),
                i,
                format!("the stage name {problem}"),
                Some(format!(
                    "stage names use letters, digits, `-`, `_` and `.`, at most {MAX_NAME_LEN} characters"
                )),
            );
        }
        match self.first_of.get(name) {
            Some(&first) => {
                let there = match self.field(first, "name") {
                    Some(s) => format!("line {}", self.rep.line_of(s.start)),
                    None => format!("stage #{}", first + 1),
                };
                self.error(
                    span,
                    i,
                    format!("the name `{name}` is already used by the stage on {there}"),
                    Some("stage names must be unique".into()),
                );
            }
            None => {
                self.first_of.insert(name, i);
                self.names.push(name);
                self.check_variable(i);
            }
        }
    }

    /// The name's input variable (which also names its output for the Python helper's
    /// `input_dir`) is no other stage's: `a-b`, `a_b`, `a.b` and `A-B` would all hand their
    /// output over as `ORCHESTRATE_INPUT_A_B`, and a downstream stage would get one of them
    /// for all.
    fn check_variable(&mut self, i: usize) {
        let name = self.stage(i).name.as_str();
        let variable = protocol::plan::input_env_var(name);
        if let Some(&first) = self.variable_of.get(&variable) {
            let other = self.stage(first).name.as_str();
            let there = match self.field(first, "name") {
                Some(s) => format!(" on line {}", self.rep.line_of(s.start)),
                None => String::new(),
            };
            self.error(
                self.field(i, "name"),
                i,
                format!("stages `{other}`{there} and `{name}` would both get the input variable {variable} (and could not be told apart on a case-insensitive file system)"),
                Some("rename one: names must differ in more than case and the characters `-`, `_` and `.`".into()),
            );
        } else {
            self.variable_of.insert(variable, i);
        }
    }

    /// The `after` list: each entry a known other stage, once. Returns the upstream indices.
    fn check_after(&mut self, i: usize) -> Vec<usize> {
        let stage = self.stage(i);
        let mut upstream = Vec::new();
        // The entries seen so far: a long list is checked in one pass, not compared pairwise.
        let mut seen: HashSet<&str> = HashSet::with_capacity(stage.after.len());
        for (j, dep) in stage.after.iter().enumerate() {
            let span = self.item(i, "after", j);
            if *dep == stage.name {
                self.error(span, i, "the stage lists itself in `after`".into(), None);
            } else if !seen.insert(dep.as_str()) {
                self.error(
                    span,
                    i,
                    format!("`after` lists `{dep}` more than once"),
                    None,
                );
            } else if let Some(&up) = self.first_of.get(dep.as_str()) {
                upstream.push(up);
            } else {
                let help = self.stage_help(dep);
                self.error(
                    span,
                    i,
                    format!("`after` names `{dep}`, which is not a stage"),
                    Some(help),
                );
            }
        }
        upstream
    }

    fn report_cycle(&mut self, cycle: &[usize]) {
        let Some(&first) = cycle.first() else { return };
        let last = *cycle.last().unwrap_or(&first);
        let mut names: Vec<&str> = cycle.iter().map(|&s| self.stage(s).name.as_str()).collect();
        names.push(&self.stage(first).name);
        let closing = self
            .stage(first)
            .after
            .iter()
            .position(|a| *a == self.stage(last).name);
        let span = match closing {
            Some(j) => self.item(first, "after", j),
            None => self.field(first, "after"),
        };
        self.error(
            span,
            first,
            format!("dependency cycle: {}", names.join(" → ")),
            Some("each stage in the cycle runs `after` the one before it, so none can start: remove one of these `after` entries".into()),
        );
    }

    /// Everything else about a stage, once the graph is known.
    fn check_body(&mut self, i: usize, upstream: &[Vec<usize>]) {
        let stage = self.stage(i);
        self.check_program(i, upstream);
        self.check_init(i, upstream);
        if let Some(kind) = stage.kind {
            let at = ParamsAt {
                stage: self.label(i),
                node: self.node(i).and_then(|n| n.get("params")),
                fallback: self.stage_span(i),
            };
            params::check(kind, &stage.params, &at, self.rep);
        }
        if stage.timeout.is_some_and(|t| t.get().is_zero()) {
            self.error(
                self.field(i, "timeout"),
                i,
                "`timeout` is zero".into(),
                Some(
                    "give a positive duration like \"30m\", or leave `timeout` out for no limit"
                        .into(),
                ),
            );
        }
        if let Some(gpus) = stage.gpus.filter(|&g| g > MAX_GPUS) {
            self.error(
                self.field(i, "gpus"),
                i,
                format!("`gpus = {gpus}` is more than any machine has (at most {MAX_GPUS})"),
                None,
            );
        }
        self.check_env(i);
        self.check_outputs(i);
        self.check_preload(i);
        self.check_task_layout(i);
        self.check_host_limits(i);
    }

    /// `memory`, `pids` and `cpus`: values a cgroup can hold (whether the host can enforce
    /// them is preflight's question).
    fn check_host_limits(&mut self, i: usize) {
        let stage = self.stage(i);
        let mut problems = Vec::new();
        if stage.memory.is_some_and(|m| m.0 < 1 << 20) {
            problems.push((
                "memory",
                "`memory` is under 1MiB, too little for any program to start",
                "give a size like \"256MiB\" or \"64GiB\"",
            ));
        }
        if stage.gpu_memory.is_some_and(|m| m.0 < 1 << 20) {
            problems.push((
                "gpu_memory",
                "`gpu_memory` is under 1MiB, too little for a CUDA context",
                "give a size like \"4GiB\" or \"20GiB\"",
            ));
        }
        if stage.gpu_memory.is_some() && stage.gpus.is_some_and(|g| g != 1) {
            problems.push((
                "gpu_memory",
                "`gpu_memory` shares one GPU: it cannot go with `gpus` other than 1",
                "leave `gpus` out (or 1) to share a GPU, or drop `gpu_memory` for whole GPUs",
            ));
        }
        if stage.pids == Some(0) {
            problems.push((
                "pids",
                "`pids = 0` lets the stage start no process",
                "give at least 1, or leave `pids` out for no limit",
            ));
        }
        if stage
            .cpus
            .is_some_and(|c| !(c.is_finite() && (0.01..=65_536.0).contains(&c)))
        {
            problems.push((
                "cpus",
                "`cpus` must be between 0.01 and 65536",
                "give the CPUs' worth of time, like 8 or 0.5",
            ));
        }
        for (key, text, help) in problems {
            self.error(self.field(i, key), i, text.into(), Some(help.into()));
        }
    }

    /// `init`: an existing stage upstream of this one (directly or not) that writes a checkpoint.
    fn check_init(&mut self, i: usize, upstream: &[Vec<usize>]) {
        let stage = self.stage(i);
        let Some(init) = stage.init.as_deref() else {
            return;
        };
        let span = self.field(i, "init");
        match self.first_of.get(init).copied() {
            None => {
                let help = self.stage_help(init);
                self.error(
                    span,
                    i,
                    format!("`init` names `{init}`, which is not a stage"),
                    Some(help),
                );
            }
            Some(_) if init == stage.name => {
                self.error(span, i, "`init` names the stage itself".into(), None);
            }
            Some(up) if !graph::is_upstream(upstream, up, i) => {
                self.error(
                    span,
                    i,
                    format!("`init` names `{init}`, which is not upstream of this stage"),
                    Some(format!("add `{init}` to `after`, so that its checkpoint exists before this stage starts")),
                );
            }
            Some(up) if self.stage(up).kind == Some(BuiltinKind::Eval) => {
                self.error(
                    span,
                    i,
                    format!("`init` names `{init}`, an eval stage, which writes no checkpoint"),
                    Some("name the train stage whose checkpoint it evaluated".into()),
                );
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(name_problem("pre-train_v2.1"), None);
        assert!(name_problem("").is_some());
        assert!(name_problem("..").is_some());
        assert!(name_problem("a b").unwrap().contains("' '"));
        assert!(name_problem(&"x".repeat(65)).unwrap().contains("65"));
        assert_eq!(name_problem(&"x".repeat(64)), None);
    }
}
