//! Fan-out: a stage with a `matrix` becomes one instance per combination of its values.
//!
//! Expansion runs after validation and gives the scheduler an ordinary plan whose stages are
//! the instances, named `stage[key=value,…]`. Dependencies follow the matrix: an instance
//! depends on the instances of each upstream stage whose values agree with its own on the keys
//! they share (so `eval[sample=a]` waits for `finetune[sample=a]`, and a stage without the key
//! waits for every instance: an aggregate). `init` and `{input.X}` must name exactly one
//! instance that way.

use super::diagnostic::Diagnostic;
use protocol::plan::{MatrixAxis, Plan, Stage};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What an expanded stage came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The stage's name in the plan (shared by its instances).
    pub base: Arc<str>,
    /// Its value of each matrix key, in key order (keys shared by the stage's instances).
    pub values: Vec<(Arc<str>, String)>,
}

fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A value as it appears in an instance's name: a path is named by its file stem
/// (`data/a.jsonl` → `a`); characters outside `[A-Za-z0-9_.-]` become `_`, and a value with
/// characters beyond ASCII (`日本`) gets a short digest of itself after them, so that two such
/// values of one length still name two instances (`__-1a2b3c4d`).
fn label(value: &str) -> String {
    let value = if value.contains('/') {
        Path::new(value)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or(value)
    } else {
        value
    };
    let s: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let s = if s.is_empty() { "_".into() } else { s };
    if value.is_ascii() {
        return s;
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(value.as_bytes());
    let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{s}-{short}")
}

/// The first value an axis gives twice, if one is.
fn repeated_value(values: &[String]) -> Option<&str> {
    let mut seen = std::collections::HashSet::with_capacity(values.len());
    values
        .iter()
        .find(|v| !seen.insert(v.as_str()))
        .map(String::as_str)
}

/// Whether `name` matches `pattern`, where `*` matches any run of bytes and `?` any one byte.
/// Greedy with one backtrack point (the last `*`), so it takes at most
/// `pattern.len() × name.len()` steps, whatever the pattern (`a*a*a*a*b` included); a
/// crate's glob syntax (`[…]`, `**`, `{a,b}`) would promise more than the plan format does.
fn wildcard(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None; // (pattern index after `*`, name index)
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p + 1, n));
                p += 1;
            }
            Some(&c) if c == b'?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                // Let the last `*` take one more byte and try again from there.
                Some((after, taken)) => {
                    p = after;
                    n = taken + 1;
                    star = Some((after, taken + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Why a matrix axis's values could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AxisError {
    /// Its `lines` file cannot be read (missing, not a regular file, larger than
    /// [`MAX_LINES_BYTES`], not UTF-8).
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: crate::store::user_file::UserFileError,
    },
    /// Its `glob` has a wildcard before the last path component.
    #[error("`{glob}`: wildcards are supported in the last path component only")]
    NestedWildcard {
        /// The pattern, as the plan writes it.
        glob: String,
    },
    /// The directory its `glob` lists cannot be listed.
    #[error("cannot list {dir}: {source}")]
    List {
        /// The directory.
        dir: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
}

/// The most a matrix's `lines` file may hold, in bytes: the plan's own limit.
pub const MAX_LINES_BYTES: u64 = super::MAX_PLAN_BYTES;

/// The values of one axis; `Err` says why they could not be read.
pub(crate) fn axis_values(axis: &MatrixAxis, base_dir: &Path) -> Result<Vec<String>, AxisError> {
    match axis {
        MatrixAxis::Values(values) => Ok(values.iter().map(ToString::to_string).collect()),
        MatrixAxis::Lines { lines } => {
            let path = base_dir.join(lines);
            let bytes = match crate::store::user_file::read_regular(&path, MAX_LINES_BYTES) {
                Ok(bytes) => bytes,
                Err(source) => return Err(AxisError::Read { path, source }),
            };
            let text = String::from_utf8(bytes).map_err(|_| AxisError::Read {
                path: path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "it is not UTF-8 text",
                )
                .into(),
            })?;
            Ok(text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(String::from)
                .collect())
        }
        MatrixAxis::Glob { glob } => {
            let full = base_dir.join(glob);
            let dir = full.parent().unwrap_or(base_dir).to_path_buf();
            let pattern = full
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if dir.to_string_lossy().contains(['*', '?']) {
                return Err(AxisError::NestedWildcard { glob: glob.clone() });
            }
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(source) => return Err(AxisError::List { dir, source }),
            };
            let mut found: Vec<String> = entries
                .filter_map(|e| e.ok())
                .filter(|e| {
                    wildcard(
                        pattern.as_bytes(),
                        e.file_name().to_string_lossy().as_bytes(),
                    )
                })
                .map(|e| {
                    let p = e.path();
                    p.strip_prefix(base_dir)
                        .map(|r| r.display().to_string())
                        .unwrap_or_else(|_| p.display().to_string())
                })
                .collect();
            found.sort();
            Ok(found)
        }
    }
}

/// An instance's values, in key order: the keys shared by every instance of its stage.
type Values = Vec<(Arc<str>, String)>;

/// Every combination of the axes, keys in order.
fn combinations(axes: &[(Arc<str>, Vec<String>)]) -> Vec<Values> {
    let total: usize = axes.iter().map(|(_, v)| v.len()).product();
    let mut combos: Vec<Values> = Vec::with_capacity(total);
    combos.push(Vec::with_capacity(axes.len()));
    for (key, values) in axes {
        combos = combos
            .into_iter()
            .flat_map(|c| {
                values.iter().map(move |v| {
                    let mut c = c.clone();
                    c.push((key.clone(), v.clone()));
                    c
                })
            })
            .collect();
    }
    combos
}

/// The value of `key` in `values`, if it has one.
fn value_of<'a>(values: &'a [(Arc<str>, String)], key: &str) -> Option<&'a str> {
    values
        .iter()
        .find(|(k, _)| &**k == key)
        .map(|(_, v)| v.as_str())
}

fn substitute(text: &str, values: &[(Arc<str>, String)], escape: bool) -> String {
    if !text.contains("{matrix.") {
        return text.to_string();
    }
    let mut out = text.to_string();
    for (k, v) in values {
        let v = if escape {
            v.replace('{', "{{").replace('}', "}}")
        } else {
            v.clone()
        };
        out = out.replace(&format!("{{matrix.{k}}}"), &v);
    }
    out
}

fn substitute_json(value: &mut serde_json::Value, values: &[(Arc<str>, String)]) {
    match value {
        serde_json::Value::String(s) => *s = substitute(s, values, false),
        serde_json::Value::Array(items) => {
            items.iter_mut().for_each(|v| substitute_json(v, values))
        }
        serde_json::Value::Object(map) => map.values_mut().for_each(|v| substitute_json(v, values)),
        _ => {}
    }
}

/// The instances of one upstream stage, found by the values of the keys it shares with a
/// downstream stage: each lookup costs O(keys), not O(instances).
struct Aligner<'a> {
    /// The shared keys.
    keys: Vec<Arc<str>>,
    /// Instance names by their values of `keys`, joined by NUL (no value holds one: every
    /// instance under the empty key when nothing is shared, an aggregate waits for all).
    by_values: HashMap<String, Vec<&'a str>>,
}

/// `values`' values of `keys`, joined by NUL.
fn projection(keys: &[Arc<str>], values: &[(Arc<str>, String)]) -> String {
    let parts: Vec<&str> = keys
        .iter()
        .map(|k| value_of(values, k).unwrap_or_default())
        .collect();
    parts.join("\0")
}

impl<'a> Aligner<'a> {
    fn new(upstream: &'a [(String, Values)], downstream_keys: &[Arc<str>]) -> Aligner<'a> {
        let keys: Vec<Arc<str>> = upstream
            .first()
            .map(|(_, values)| {
                values
                    .iter()
                    .map(|(k, _)| k.clone())
                    .filter(|k| downstream_keys.contains(k))
                    .collect()
            })
            .unwrap_or_default();
        let mut by_values: HashMap<String, Vec<&str>> = HashMap::new();
        for (name, values) in upstream {
            by_values
                .entry(projection(&keys, values))
                .or_default()
                .push(name.as_str());
        }
        Aligner { keys, by_values }
    }

    /// The upstream instances whose values agree with `values` on the shared keys.
    fn aligned(&self, values: &[(Arc<str>, String)]) -> &[&'a str] {
        self.by_values
            .get(&projection(&self.keys, values))
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
}

/// The problems expansion finds, each about one stage of the plan named `source_name`.
struct Problems<'s> {
    source_name: &'s str,
    found: Vec<Diagnostic>,
}

impl Problems<'_> {
    fn push(&mut self, stage: &str, message: String, help: Option<String>) {
        self.found.push(Diagnostic {
            source_name: self.source_name.to_string(),
            line: None,
            column: None,
            stage: Some(stage.to_string()),
            message,
            help,
        });
    }

    fn is_empty(&self) -> bool {
        self.found.is_empty()
    }
}

/// Every stage's instances, as (name, values), and its matrix keys; by the stage's name.
struct Instances<'p> {
    of: HashMap<&'p str, Vec<(String, Values)>>,
    keys_of: HashMap<&'p str, Vec<Arc<str>>>,
}

/// Expands every matrix stage. Returns the plan of instances and, per instance, what it came
/// from (`None` for a stage without a matrix), or the problems found. Linear in the number of
/// instances and their dependencies.
pub fn expand(
    plan: Plan,
    base_dir: &Path,
    source_name: &str,
) -> Result<(Plan, Vec<Option<Instance>>), Vec<Diagnostic>> {
    if plan.stages.iter().all(|s| s.matrix.is_empty()) {
        let n = plan.stages.len();
        return Ok((plan, vec![None; n]));
    }
    let mut problems = Problems {
        source_name,
        found: Vec::new(),
    };
    let instances = instances_of(&plan, base_dir, &mut problems);
    if !problems.is_empty() {
        return Err(problems.found);
    }
    name_clashes(&plan, &instances, &mut problems);
    let (stages, origins) = instantiate(&plan, &instances, &mut problems);
    if !problems.is_empty() {
        return Err(problems.found);
    }
    Ok((
        Plan {
            run: plan.run,
            stages,
        },
        origins,
    ))
}

/// The instances of every stage of `plan`: one per combination of its matrix values.
fn instances_of<'p>(plan: &'p Plan, base_dir: &Path, problems: &mut Problems) -> Instances<'p> {
    let mut instances = Instances {
        of: HashMap::new(),
        keys_of: HashMap::new(),
    };
    for stage in &plan.stages {
        let axes = axes_of(stage, base_dir, problems);
        instances.keys_of.insert(
            stage.name.as_str(),
            axes.iter().map(|(k, _)| k.clone()).collect(),
        );
        let list = combinations(&axes)
            .into_iter()
            .map(|values| (instance_name(&stage.name, &values), values))
            .collect();
        instances.of.insert(stage.name.as_str(), list);
    }
    instances
}

/// The matrix of `stage` as (key, values) axes; the keys and axes in error are left out, and
/// said in `problems`.
fn axes_of(
    stage: &Stage,
    base_dir: &Path,
    problems: &mut Problems,
) -> Vec<(Arc<str>, Vec<String>)> {
    let mut axes = Vec::new();
    for (key, axis) in &stage.matrix {
        if !valid_key(key) {
            problems.push(
                &stage.name,
                format!("matrix key `{key}` is not a valid name"),
                Some("use letters, digits and `_`".into()),
            );
            continue;
        }
        match axis_values(axis, base_dir) {
            Ok(values) if values.is_empty() => problems.push(
                &stage.name,
                format!("matrix key `{key}` has no values"),
                None,
            ),
            Ok(values) => match repeated_value(&values) {
                Some(value) => problems.push(
                    &stage.name,
                    format!("matrix key `{key}` has the value `{value}` twice"),
                    Some("each value makes one instance: remove the repeated one".into()),
                ),
                None => axes.push((Arc::<str>::from(key.as_str()), values)),
            },
            Err(why) => problems.push(&stage.name, format!("matrix key `{key}`: {why}"), None),
        }
    }
    axes
}

/// An instance's name: `stage[key=value,…]`, or the stage's own without a matrix.
fn instance_name(stage: &str, values: &Values) -> String {
    if values.is_empty() {
        return stage.to_string();
    }
    let parts: Vec<String> = values
        .iter()
        .map(|(k, v)| format!("{k}={}", label(v)))
        .collect();
    format!("{stage}[{}]", parts.join(","))
}

/// Instances that would share a name, or an input variable, as stages must not.
fn name_clashes(plan: &Plan, instances: &Instances, problems: &mut Problems) {
    let total: usize = instances.of.values().map(Vec::len).sum();
    let mut seen: HashMap<&str, &str> = HashMap::with_capacity(total);
    for stage in &plan.stages {
        for (name, _) in &instances.of[stage.name.as_str()] {
            if let Some(first) = seen.insert(name.as_str(), stage.name.as_str()) {
                problems.push(&stage.name, format!("two instances are both named `{name}` (also from `{first}`): their values differ only in characters a name cannot hold"), None);
            }
        }
    }
    drop(seen);
    // Instances, like stages, must not share an input variable (`x[v=a-b]`, `x[v=a_b]`).
    let mut variables: HashMap<String, &str> = HashMap::with_capacity(total);
    for stage in &plan.stages {
        for (name, _) in &instances.of[stage.name.as_str()] {
            let variable = protocol::plan::input_env_var(name);
            match variables.get(&variable) {
                Some(first) if first != name => problems.push(
                    &stage.name,
                    format!("`{first}` and `{name}` would both get the input variable {variable}"),
                    Some("give values (or stage names) that differ in more than case and the characters `-`, `_` and `.`".into()),
                ),
                Some(_) => {}
                None => {
                    variables.insert(variable, name.as_str());
                }
            }
        }
    }
}

/// The stages of the expanded plan, one per instance, and what each came from.
fn instantiate(
    plan: &Plan,
    instances: &Instances,
    problems: &mut Problems,
) -> (Vec<Stage>, Vec<Option<Instance>>) {
    let total: usize = instances.of.values().map(Vec::len).sum();
    let mut stages: Vec<Stage> = Vec::with_capacity(total);
    let mut origins = Vec::with_capacity(total);
    for stage in &plan.stages {
        let own_keys = &instances.keys_of[stage.name.as_str()];
        let aligners: HashMap<&str, Aligner> = stage
            .after
            .iter()
            .chain(stage.init.iter())
            .map(|up| {
                (
                    up.as_str(),
                    Aligner::new(&instances.of[up.as_str()], own_keys),
                )
            })
            .collect();
        let base: Arc<str> = Arc::from(stage.name.as_str());
        for (name, values) in &instances.of[stage.name.as_str()] {
            let upstream = Upstream {
                instances,
                aligners: &aligners,
                values,
            };
            stages.push(instance_stage(stage, name, &upstream, problems));
            origins.push(if values.is_empty() {
                None
            } else {
                Some(Instance {
                    base: base.clone(),
                    values: values.clone(),
                })
            });
        }
    }
    (stages, origins)
}

/// What one instance sees upstream: every stage's instances, and those of its own upstream
/// stages that agree with its `values`.
struct Upstream<'i, 'p> {
    instances: &'i Instances<'p>,
    aligners: &'i HashMap<&'p str, Aligner<'i>>,
    values: &'i Values,
}

impl Upstream<'_, '_> {
    /// The instances of the upstream stage `up` that agree with this instance's values.
    fn aligned(&self, up: &str) -> &[&str] {
        self.aligners[up].aligned(self.values)
    }
}

/// The instance `name` of `stage`: its dependencies, `init`, command and parameters those of
/// its values and its aligned upstream instances.
fn instance_stage(
    stage: &Stage,
    name: &str,
    upstream: &Upstream,
    problems: &mut Problems,
) -> Stage {
    let values = upstream.values;
    let mut inst = skeleton(stage);
    inst.name = name.to_string();
    inst.after = stage
        .after
        .iter()
        .flat_map(|u| upstream.aligned(u).iter().map(|n| n.to_string()))
        .collect();
    if let Some(init) = &stage.init {
        match upstream.aligned(init) {
            [one] => inst.init = Some(one.to_string()),
            many => problems.push(&stage.name, format!("`init = \"{init}\"` matches {} instances of `{init}` for `{name}`; it must match exactly one", many.len()), Some("give both stages the same matrix key, so that each instance starts from its own".into())),
        }
    }
    if let Some(command) = &stage.command {
        let args = command
            .iter()
            .map(|arg| instance_arg(stage, name, arg, upstream, problems))
            .collect();
        inst.command = Some(args);
    }
    inst.params = stage.params.clone();
    if !values.is_empty() {
        for v in inst.params.values_mut() {
            substitute_json(v, values);
        }
    }
    inst
}

/// One argument of the command of the instance `name` of `stage`: its matrix values
/// substituted, and each `{input.X}` of a matrix stage X naming the one aligned instance.
fn instance_arg(
    stage: &Stage,
    name: &str,
    arg: &str,
    upstream: &Upstream,
    problems: &mut Problems,
) -> String {
    let mut arg = substitute(arg, upstream.values, true);
    for up in &stage.after {
        let placeholder = format!("{{input.{up}}}");
        let ups = &upstream.instances.of[up.as_str()];
        if !arg.contains(&placeholder) || ups.len() == 1 && ups[0].0 == *up {
            continue;
        }
        match upstream.aligned(up) {
            [one] => arg = arg.replace(&placeholder, &format!("{{input.{one}}}")),
            many => problems.push(&stage.name, format!("`{placeholder}` matches {} instances of `{up}` for `{name}`", many.len()), Some("an aggregate stage finds every input in $ORCHESTRATE_SPEC (`inputs`) or the ORCHESTRATE_INPUT_* variables".into())),
        }
    }
    arg
}

/// `stage` without its name, dependencies, command, parameters and matrix, which each
/// instance has of its own (cloning a stage's matrix per instance would cost the square of
/// the number of instances).
fn skeleton(stage: &Stage) -> Stage {
    Stage {
        name: String::new(),
        after: Vec::new(),
        kind: stage.kind,
        command: None,
        params: serde_json::Map::new(),
        init: stage.init.clone(),
        timeout: stage.timeout,
        stall_timeout: stage.stall_timeout,
        rank_grace: stage.rank_grace,
        retry_on: stage.retry_on.clone(),
        retries: stage.retries,
        gpus: stage.gpus,
        env: stage.env.clone(),
        outputs: stage.outputs.clone(),
        matrix: BTreeMap::new(),
        nodes: stage.nodes,
        tasks_per_node: stage.tasks_per_node,
        gpus_per_task: stage.gpus_per_task,
        preload: stage.preload.clone(),
        memory: stage.memory,
        pids: stage.pids,
        cpus: stage.cpus,
        retry_oom: stage.retry_oom,
        gpu_memory: stage.gpu_memory,
    }
}

/// The variables an instance's processes get for its matrix values: `ORCHESTRATE_MATRIX_<KEY>`
/// (kept out of the stage's own `env` so that a 100,000-instance sweep does not hold a map per
/// instance; [`super::LoadedPlan::stage_as_run`] puts them back).
pub fn matrix_env(instance: &Instance) -> impl Iterator<Item = (String, String)> + '_ {
    instance.values.iter().map(|(k, v)| {
        (
            format!("ORCHESTRATE_MATRIX_{}", k.to_ascii_uppercase()),
            v.clone(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::plan::MatrixValue;

    #[test]
    fn a_pathological_pattern_returns_at_once() {
        let name = vec![b'a'; 4096];
        let t = std::time::Instant::now();
        assert!(!wildcard(b"a*a*a*a*a*a*a*a*a*a*a*a*b", &name));
        assert!(wildcard(b"a*a*a*a*a*a*a*a*a*a*a*a*", &name));
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn wildcards() {
        assert!(wildcard(b"*.jsonl", b"a.jsonl"));
        assert!(wildcard(b"a*b*c", b"aXbYbZc"));
        assert!(!wildcard(b"a*b*c", b"aXbYbZ"));
        assert!(wildcard(b"??", b"ab"));
        assert!(!wildcard(b"??", b"abc"));
        assert!(wildcard(b"**x", b"x"));
        assert!(wildcard(b"s?.txt", b"s1.txt"));
        assert!(!wildcard(b"*.jsonl", b"a.json"));
        assert!(wildcard(b"*", b""));
    }

    #[test]
    fn product_and_labels() {
        let axes = vec![
            (Arc::from("a"), vec!["1".into(), "2".into()]),
            (Arc::from("b"), vec!["x/y".into()]),
        ];
        let c = combinations(&axes);
        assert_eq!(c.len(), 2);
        assert_eq!(value_of(&c[1], "a"), Some("2"));
        assert_eq!(value_of(&c[1], "b"), Some("x/y"));
        assert_eq!(label("data/x.jsonl"), "x");
        assert_eq!(label("a b"), "a_b");
        let (a, b) = (label("日本"), label("中文"));
        assert!(a.starts_with("__-") && b.starts_with("__-"), "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(label("日本"), a, "the same value, the same name");
        assert!(a
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)));
        assert_eq!(
            repeated_value(&["x".into(), "y".into(), "x".into()]),
            Some("x")
        );
        assert_eq!(repeated_value(&["x".into(), "y".into()]), None);
    }

    #[test]
    fn instances_align_by_shared_keys_in_linear_time() {
        let n = 20_000;
        let ids: Vec<MatrixValue> = (0..n).map(MatrixValue::Int).collect();
        let stage = |name: &str, after: &[&str]| Stage {
            name: name.into(),
            after: after.iter().map(|s| s.to_string()).collect(),
            command: Some(vec!["true".into()]),
            matrix: BTreeMap::from([("i".to_string(), MatrixAxis::Values(ids.clone()))]),
            ..serde_json::from_str(&format!("{{\"name\": \"{name}\"}}")).unwrap()
        };
        let mut summary: Stage = serde_json::from_str("{\"name\": \"summary\"}").unwrap();
        summary.after = vec!["b".into()];
        let plan = Plan {
            run: Default::default(),
            stages: vec![stage("a", &[]), stage("b", &["a"]), summary],
        };
        let t = std::time::Instant::now();
        let (plan, origins) = expand(plan, Path::new("/"), "t.toml").unwrap();
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(plan.stages.len(), 2 * n as usize + 1);
        let b7 = &plan.stages[n as usize + 7];
        assert_eq!(b7.name, "b[i=7]");
        assert_eq!(b7.after, vec!["a[i=7]".to_string()]);
        assert_eq!(plan.stages.last().unwrap().after.len(), n as usize);
        let origin = origins[n as usize + 7].as_ref().unwrap();
        assert_eq!(&*origin.base, "b");
        assert_eq!(
            matrix_env(origin).collect::<Vec<_>>(),
            vec![("ORCHESTRATE_MATRIX_I".to_string(), "7".to_string())]
        );
        assert!(
            b7.env.is_empty(),
            "matrix variables are not stored per instance"
        );
    }
}
