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
use std::path::Path;

/// What an expanded stage came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The stage's name in the plan.
    pub base: String,
    /// Its value of each matrix key.
    pub values: BTreeMap<String, String>,
}

fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A value as it appears in an instance's name: a path is named by its file stem
/// (`data/a.jsonl` → `a`); characters outside `[A-Za-z0-9_.-]` become `_`.
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
    if s.is_empty() {
        "_".into()
    } else {
        s
    }
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

/// The values of one axis; `Err` says why they could not be read.
pub(crate) fn axis_values(axis: &MatrixAxis, base_dir: &Path) -> Result<Vec<String>, String> {
    match axis {
        MatrixAxis::Values(values) => Ok(values.iter().map(ToString::to_string).collect()),
        MatrixAxis::Lines { lines } => {
            let path = base_dir.join(lines);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
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
                return Err(format!(
                    "`{glob}`: wildcards are supported in the last path component only"
                ));
            }
            let entries = std::fs::read_dir(&dir)
                .map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
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

/// An instance's name and values.
type Named = (String, BTreeMap<String, String>);

/// Every combination of the axes, keys in order.
fn combinations(axes: &[(String, Vec<String>)]) -> Vec<BTreeMap<String, String>> {
    let mut combos = vec![BTreeMap::new()];
    for (key, values) in axes {
        combos = combos
            .into_iter()
            .flat_map(|c| {
                values.iter().map(move |v| {
                    let mut c = c.clone();
                    c.insert(key.clone(), v.clone());
                    c
                })
            })
            .collect();
    }
    combos
}

fn agree(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> bool {
    a.iter().all(|(k, v)| b.get(k).is_none_or(|w| w == v))
}

fn substitute(text: &str, values: &BTreeMap<String, String>, escape: bool) -> String {
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

fn substitute_json(value: &mut serde_json::Value, values: &BTreeMap<String, String>) {
    match value {
        serde_json::Value::String(s) => *s = substitute(s, values, false),
        serde_json::Value::Array(items) => {
            items.iter_mut().for_each(|v| substitute_json(v, values))
        }
        serde_json::Value::Object(map) => map.values_mut().for_each(|v| substitute_json(v, values)),
        _ => {}
    }
}

/// Expands every matrix stage. Returns the plan of instances and, per instance, what it came
/// from (`None` for a stage without a matrix), or the problems found.
pub fn expand(
    plan: Plan,
    base_dir: &Path,
    source_name: &str,
) -> Result<(Plan, Vec<Option<Instance>>), Vec<Diagnostic>> {
    if plan.stages.iter().all(|s| s.matrix.is_empty()) {
        let n = plan.stages.len();
        return Ok((plan, vec![None; n]));
    }
    let mut problems = Vec::new();
    let problem = |stage: &str, message: String, help: Option<String>| Diagnostic {
        source_name: source_name.to_string(),
        line: None,
        column: None,
        stage: Some(stage.to_string()),
        message,
        help,
    };
    // Instances of every stage: (name, values).
    let mut instances: HashMap<&str, Vec<Named>> = HashMap::new();
    for stage in &plan.stages {
        let mut axes = Vec::new();
        for (key, axis) in &stage.matrix {
            if !valid_key(key) {
                problems.push(problem(
                    &stage.name,
                    format!("matrix key `{key}` is not a valid name"),
                    Some("use letters, digits and `_`".into()),
                ));
                continue;
            }
            match axis_values(axis, base_dir) {
                Ok(values) if values.is_empty() => problems.push(problem(
                    &stage.name,
                    format!("matrix key `{key}` has no values"),
                    None,
                )),
                Ok(values) => axes.push((key.clone(), values)),
                Err(why) => problems.push(problem(
                    &stage.name,
                    format!("matrix key `{key}`: {why}"),
                    None,
                )),
            }
        }
        let list = combinations(&axes)
            .into_iter()
            .map(|values| {
                let name = if values.is_empty() {
                    stage.name.clone()
                } else {
                    let parts: Vec<String> = values
                        .iter()
                        .map(|(k, v)| format!("{k}={}", label(v)))
                        .collect();
                    format!("{}[{}]", stage.name, parts.join(","))
                };
                (name, values)
            })
            .collect();
        instances.insert(stage.name.as_str(), list);
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let mut seen = HashMap::new();
    let mut stages: Vec<Stage> = Vec::new();
    let mut origins = Vec::new();
    for stage in &plan.stages {
        for (name, values) in &instances[stage.name.as_str()] {
            if let Some(first) = seen.insert(name.clone(), stage.name.clone()) {
                problems.push(problem(&stage.name, format!("two instances are both named `{name}` (also from `{first}`): their values differ only in characters a name cannot hold"), None));
            }
            let aligned = |up: &str| -> Vec<&str> {
                instances[up]
                    .iter()
                    .filter(|(_, v)| agree(v, values))
                    .map(|(n, _)| n.as_str())
                    .collect()
            };
            let mut inst = stage.clone();
            inst.name = name.clone();
            inst.matrix = BTreeMap::new();
            inst.after = stage
                .after
                .iter()
                .flat_map(|u| aligned(u))
                .map(String::from)
                .collect();
            if let Some(init) = &stage.init {
                match aligned(init).as_slice() {
                    [one] => inst.init = Some(one.to_string()),
                    many => problems.push(problem(&stage.name, format!("`init = \"{init}\"` matches {} instances of `{init}` for `{name}`; it must match exactly one", many.len()), Some("give both stages the same matrix key, so that each instance starts from its own".into()))),
                }
            }
            if let Some(command) = &stage.command {
                let mut args = Vec::with_capacity(command.len());
                for arg in command {
                    let mut arg = substitute(arg, values, true);
                    for up in &stage.after {
                        let placeholder = format!("{{input.{up}}}");
                        if !arg.contains(&placeholder)
                            || instances[up.as_str()].len() == 1
                                && instances[up.as_str()][0].0 == *up
                        {
                            continue;
                        }
                        match aligned(up).as_slice() {
                            [one] => arg = arg.replace(&placeholder, &format!("{{input.{one}}}")),
                            many => problems.push(problem(&stage.name, format!("`{placeholder}` matches {} instances of `{up}` for `{name}`", many.len()), Some("an aggregate stage finds every input in $ORCHESTRATE_SPEC (`inputs`) or the ORCHESTRATE_INPUT_* variables".into()))),
                        }
                    }
                    args.push(arg);
                }
                inst.command = Some(args);
            }
            for v in inst.params.values_mut() {
                substitute_json(v, values);
            }
            for (k, v) in values {
                inst.env.insert(
                    format!("ORCHESTRATE_MATRIX_{}", k.to_ascii_uppercase()),
                    v.clone(),
                );
            }
            stages.push(inst);
            origins.push(if values.is_empty() {
                None
            } else {
                Some(Instance {
                    base: stage.name.clone(),
                    values: values.clone(),
                })
            });
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok((
        Plan {
            run: plan.run,
            stages,
        },
        origins,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            ("a".to_string(), vec!["1".into(), "2".into()]),
            ("b".to_string(), vec!["x/y".into()]),
        ];
        let c = combinations(&axes);
        assert_eq!(c.len(), 2);
        assert_eq!(label("data/x.jsonl"), "x");
        assert_eq!(label("a b"), "a_b");
        assert!(agree(&c[0], &BTreeMap::from([("a".into(), "1".into())])));
        assert!(!agree(&c[1], &BTreeMap::from([("a".into(), "1".into())])));
    }
}
