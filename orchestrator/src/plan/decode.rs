//! Decoding the text into [`Plan`], and turning the decoders' errors into plain messages.
//!
//! Syntax and type errors stop decoding at the first one. Its position comes from the decoder
//! (a byte span from `toml`, a line and byte column from `serde_json`); the key it is about
//! comes from the spanned [`Node`] tree, so the message can say "`retries` must be a whole
//! number ≥ 0" instead of "invalid value: integer `-1`, expected u32".

use super::diagnostic::Reporter;
use super::suggest;
use super::tree::{Node, Seg, Value};
use protocol::plan::Plan;
use std::ops::Range;

/// Keys of a stage table, for hints about misplaced keys.
const STAGE_KEYS: &[&str] = &[
    "name", "after", "kind", "command", "params", "init", "timeout", "retries", "gpus", "env",
    "outputs",
];

/// Decodes TOML text, reporting the first syntax or type error.
pub(crate) fn toml_plan(source: &str, tree: Option<&Node>, rep: &mut Reporter) -> Option<Plan> {
    let error = match toml::from_str::<Plan>(source) {
        Ok(plan) => return tables_are_tables(plan, tree, rep),
        Err(error) => error,
    };
    let span = error.span();
    if toml::from_str::<toml::Table>(source).is_err() {
        let mut lines = error
            .message()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty());
        let mut message = format!("invalid TOML: {}", lines.next().unwrap_or("syntax error"));
        for line in lines {
            message.push_str(", ");
            message.push_str(line);
        }
        let help = (message.contains("duplicate key `stage`"))
            .then(|| "write `[[stage]]` (double brackets) before each stage".to_string());
        rep.error(span, None, message, help);
    } else {
        data_error(error.message(), span, tree, rep);
    }
    None
}

/// Decodes JSON text, reporting the first syntax or type error.
pub(crate) fn json_plan(source: &str, tree: Option<&Node>, rep: &mut Reporter) -> Option<Plan> {
    let error = match serde_json::from_str::<Plan>(source) {
        Ok(plan) => return tables_are_tables(plan, tree, rep),
        Err(error) => error,
    };
    let full = error.to_string();
    let suffix = format!(" at line {} column {}", error.line(), error.column());
    let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
    // serde_json's column is that of the last byte it read: inside the offending token, or,
    // when it only peeked at a value (a table where a string belongs), just before it.
    let mut offset = rep.index().offset_of(error.line(), error.column().max(1));
    if let Some(o) = offset.as_mut() {
        let bytes = source.as_bytes();
        if bytes
            .get(*o)
            .is_some_and(|b| matches!(b, b':' | b',' | b'[' | b' ' | b'\t' | b'\n' | b'\r'))
        {
            *o += 1;
            while bytes
                .get(*o)
                .is_some_and(|b| matches!(b, b':' | b',' | b' ' | b'\t' | b'\n' | b'\r'))
            {
                *o += 1;
            }
        }
    }
    let span = offset.map(|o| o..(o + 1).min(source.len()).max(o));
    let valid_json = || serde_json::from_str::<serde::de::IgnoredAny>(source).is_ok();
    match error.classify() {
        serde_json::error::Category::Data => data_error(&message, span, tree, rep),
        // serde_json calls some type errors syntax errors ("expected value" for `"kind": {}`).
        serde_json::error::Category::Syntax if tree.is_some() && valid_json() => {
            data_error(&message, span, tree, rep)
        }
        _ if source.trim().is_empty() => rep.error(
            None,
            None,
            "the plan is empty",
            Some("a plan is a JSON object with a `stage` array".into()),
        ),
        _ => rep.error(span, None, format!("invalid JSON: {message}"), None),
    }
    None
}

/// serde reads a struct from a list too (`run = ["x"]` sets `run.name`); the plan format has
/// tables there, so a decoded plan whose tree shows a list in such a place is refused.
fn tables_are_tables(plan: Plan, tree: Option<&Node>, rep: &mut Reporter) -> Option<Plan> {
    let Some(tree) = tree else { return Some(plan) };
    let stages = tree.get("stage").map_or(0, |s| match &s.value {
        Value::Array(items) => items.len(),
        _ => 0,
    });
    let stage = |i: usize| vec![Seg::Key("stage".into()), Seg::Index(i)];
    let paths = [vec![], vec![Seg::Key("run".into())]]
        .into_iter()
        .chain((0..stages).map(stage));
    for path in paths {
        if let Some((container, _)) = shape_mistake(tree, &path) {
            let node = tree.find(&container);
            let found = node.map_or_else(|| "a list".to_string(), |n| node_text(n, rep));
            let message = match container.as_slice() {
                [] => format!("the plan must be a table, not {found}"),
                [_] => format!("`run` must be a table, not {found}"),
                _ => format!("each entry of `stage` must be a table, not {found}"),
            };
            let stage = stage_of(Some(tree), &container).and_then(|(_, name)| name);
            rep.error(node.and_then(|n| n.span.clone()), stage, message, None);
            return None;
        }
    }
    Some(plan)
}

/// What a serde error message says, taken apart.
#[derive(Debug, PartialEq)]
enum Problem {
    UnknownField {
        field: String,
        expected: Vec<String>,
    },
    MissingField(String),
    DuplicateField(String),
    UnknownVariant {
        variant: String,
        expected: Vec<String>,
    },
    WrongType {
        found: Option<String>,
        expected: String,
    },
    BadDuration(String),
    Other(String),
}

/// The first backquoted word of `text`.
fn quoted(text: &str) -> Option<String> {
    let start = text.find('`')? + 1;
    let len = text[start..].find('`')?;
    Some(text[start..start + len].to_string())
}

/// Every backquoted word of `text`.
fn all_quoted(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn classify(raw: &str) -> Problem {
    if let Some(rest) = raw.strip_prefix("unknown field ") {
        let (field, expected) = rest.split_once(", expected").unwrap_or((rest, ""));
        return Problem::UnknownField {
            field: quoted(field).unwrap_or_default(),
            expected: all_quoted(expected),
        };
    }
    if let Some(rest) = raw.strip_prefix("unknown variant ") {
        let (variant, expected) = rest.split_once(", expected").unwrap_or((rest, ""));
        return Problem::UnknownVariant {
            variant: quoted(variant).unwrap_or_default(),
            expected: all_quoted(expected),
        };
    }
    if let Some(rest) = raw.strip_prefix("missing field ") {
        return Problem::MissingField(quoted(rest).unwrap_or_default());
    }
    if let Some(rest) = raw.strip_prefix("duplicate field ") {
        return Problem::DuplicateField(quoted(rest).unwrap_or_default());
    }
    if raw.starts_with("invalid duration ") {
        return Problem::BadDuration(quoted(raw).unwrap_or_default());
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some((found, expected)) = raw
            .strip_prefix(prefix)
            .and_then(|r| r.rsplit_once(", expected "))
        {
            return Problem::WrongType {
                found: Some(found_text(found)),
                expected: expected.to_string(),
            };
        }
    }
    Problem::Other(raw.to_string())
}

/// `text`, cut to a length that fits in a message.
fn shorten(text: &str) -> String {
    const MAX: usize = 40;
    if text.chars().count() <= MAX {
        return text.to_string();
    }
    let mut short: String = text.chars().take(MAX).collect();
    short.push('…');
    short
}

/// serde's description of an unexpected value, as the user wrote it.
fn found_text(found: &str) -> String {
    shorten(&found_full(found))
}

fn found_full(found: &str) -> String {
    for prefix in ["integer ", "floating point ", "boolean ", "character "] {
        if let Some(value) = found.strip_prefix(prefix) {
            return value.trim_matches('`').to_string();
        }
    }
    if let Some(text) = found.strip_prefix("string ") {
        return format!("the string {text}");
    }
    match found {
        "map" => "a table".into(),
        "sequence" => "a list".into(),
        "unit value" | "null" => "null".into(),
        other => other.to_string(),
    }
}

/// The plain description of a type serde names, for keys this module has no entry for.
fn plain_expected(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number ≥ 0".into(),
        "i8" | "i16" | "i32" | "i64" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "a sequence" => "a list".into(),
        "a map" => "a table".into(),
        "a boolean" | "a string" => expected.into(),
        other if other.starts_with("struct ") => "a table".into(),
        other => other.into(),
    }
}

/// What the value at a plan path must be, in words; `None` for paths this module does not know.
fn describe(path: &[Seg]) -> Option<&'static str> {
    use Seg::{Index, Key};
    fn key(s: &Seg) -> Option<&str> {
        match s {
            Key(k) => Some(k.as_str()),
            Index(_) => None,
        }
    }
    let keys: Vec<Option<&str>> = path.iter().map(key).collect();
    let duration = "a duration such as \"90s\", \"30m\" or \"1h30m\"";
    Some(match keys.as_slice() {
        [] => "a table with `run` and `stage` keys",
        [Some("run")] => "a table",
        [Some("run"), Some(k)] => match *k {
            "name" => "a string",
            "max_parallel" => "a whole number ≥ 1",
            "grace" | "reclaim_timeout" => duration,
            "gpu_check" => "one of auto, required, off",
            "gpu_tolerance_mib" => "a whole number ≥ 0 (MiB)",
            "on_leak" => "one of fail, quarantine, warn",
            "worker" => "a string (the path of the stage-worker binary)",
            _ => return None,
        },
        [Some("stage")] => "an array of tables",
        [Some("stage"), None] => "a table",
        [Some("stage"), None, Some(k)] => match *k {
            "name" => "a string",
            "after" => "a list of stage names, like [\"pretrain\"]",
            "kind" => "one of train, eval",
            "command" => {
                "a list of strings: the program and its arguments, like [\"python\", \"train.py\"]"
            }
            "params" => "a table",
            "init" => "a stage name (a string)",
            "timeout" => duration,
            "retries" | "gpus" => "a whole number ≥ 0",
            "env" => "a table of NAME = \"value\" strings",
            "outputs" => "a list of paths relative to the output directory",
            _ => return None,
        },
        [Some("stage"), None, Some(k), _] => match *k {
            "after" => "a stage name (a string)",
            "command" | "env" => "a string",
            "outputs" => "a string (a relative path)",
            _ => return None,
        },
        _ => return None,
    })
}

/// For a type error message from serde: what was wanted, in words, and what was found.
pub(crate) fn type_problem(raw: &str) -> Option<(String, Option<String>)> {
    match classify(raw) {
        Problem::WrongType { found, expected } => Some((plain_expected(&expected), found)),
        _ => None,
    }
}

/// What the plan format has at `path`: a table, a list, or something else (`None`).
fn expected_shape(path: &[Seg]) -> Option<Shape> {
    use Seg::{Index, Key};
    let is = |seg: &Seg, name: &str| matches!(seg, Key(k) if k == name);
    match path {
        [] => Some(Shape::Table),
        [k] if is(k, "run") => Some(Shape::Table),
        [k] if is(k, "stage") => Some(Shape::List),
        [k, Index(_)] if is(k, "stage") => Some(Shape::Table),
        [k, Index(_), f] if is(k, "stage") => match f {
            Key(f) if f == "params" || f == "env" => Some(Shape::Table),
            Key(f) if f == "after" || f == "command" || f == "outputs" => Some(Shape::List),
            _ => None,
        },
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Table,
    List,
}

/// How a value of the tree reads in a message: "a table", "a list", "the string \"x\"", "3".
fn node_text(node: &Node, rep: &Reporter) -> String {
    match &node.value {
        Value::Table(_) => "a table".into(),
        Value::Array(_) => "a list".into(),
        Value::DateTime => "a date-time".into(),
        Value::String(s) => format!("the string {}", shorten(&format!("{s:?}"))),
        Value::Other => node
            .span
            .as_ref()
            .and_then(|s| rep.text(s))
            .map(shorten)
            .unwrap_or_else(|| "a value of another type".into()),
    }
}

/// The first container on `path` whose kind is not the one the format wants there: serde
/// reports such a mistake from inside it (a list read as a table reports its second element),
/// so the message is better put at the container.
fn shape_mistake(tree: &Node, path: &[Seg]) -> Option<(Vec<Seg>, Shape)> {
    for len in 0..=path.len() {
        let prefix = &path[..len];
        let (Some(want), Some(node)) = (expected_shape(prefix), tree.find(prefix)) else {
            continue;
        };
        let fits = match want {
            Shape::Table => matches!(node.value, Value::Table(_)),
            Shape::List => matches!(node.value, Value::Array(_)),
        };
        if !fits {
            return Some((prefix.to_vec(), want));
        }
    }
    None
}

/// The name of a path for messages: keys joined by dots, indices in brackets.
fn label(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// The stage a path is in: its index, and its name when the tree has one.
pub(crate) fn stage_of<'t>(
    tree: Option<&'t Node>,
    path: &[Seg],
) -> Option<(usize, Option<&'t str>)> {
    match path {
        [Seg::Key(k), Seg::Index(i), ..] if k == "stage" => {
            let name = tree
                .and_then(|t| t.find(&path[..2]))
                .and_then(|s| s.get("name"))
                .and_then(Node::as_str);
            Some((*i, name))
        }
        _ => None,
    }
}

fn data_error(raw: &str, span: Option<Range<usize>>, tree: Option<&Node>, rep: &mut Reporter) {
    let problem = classify(raw);
    let location = tree.zip(span.as_ref()).and_then(|(t, s)| t.locate(s));
    let Some(location) = location else {
        let message = match &problem {
            Problem::WrongType {
                found: Some(found),
                expected,
            } => format!("expected {}, found {found}", plain_expected(expected)),
            _ => raw.to_string(),
        };
        rep.error(span, None, message, None);
        return;
    };
    let mut path = location.path.clone();
    // Where the diagnostic points: the key or value the error is about.
    let mut point = Some(location.span.clone());
    let mut problem = problem;
    if location.on_key
        && matches!(
            problem,
            Problem::UnknownField { .. } | Problem::DuplicateField(_)
        )
    {
        path.pop();
    }
    let tree_node = |path: &[Seg]| tree.and_then(|t| t.find(path));
    if let Some((container, want)) = tree.and_then(|t| shape_mistake(t, &path)) {
        let node = tree_node(&container);
        point = node.and_then(|n| n.span.clone()).or(point);
        problem = Problem::WrongType {
            found: node.map(|n| node_text(n, rep)),
            expected: if want == Shape::Table {
                "a map".into()
            } else {
                "a sequence".into()
            },
        };
        path = container;
    } else if let (Problem::Other(_), Some(_), false) = (&problem, describe(&path), location.on_key)
    {
        // A decoder's own wording (toml's "wanted string or table") for a value of the wrong
        // type at a key the format describes: say what the key takes instead.
        problem = Problem::WrongType {
            found: tree_node(&path).map(|n| node_text(n, rep)),
            expected: String::new(),
        };
    } else if let (Problem::WrongType { found, .. }, false) = (&mut problem, location.on_key) {
        if let Some(node) = tree_node(&path)
            .filter(|n| matches!(n.value, Value::DateTime | Value::Table(_) | Value::Array(_)))
        {
            *found = Some(node_text(node, rep));
        }
    }
    // An error inside a value that should have been a scalar (`gpus = [{}]`, `kind = { x = 1 }`)
    // is about the value as a whole.
    let about_a_value = matches!(
        problem,
        Problem::WrongType { .. } | Problem::Other(_) | Problem::UnknownVariant { .. }
    );
    if about_a_value && describe(&path).is_none() {
        let scalar_parent = (1..path.len())
            .rev()
            .map(|len| &path[..len])
            .find(|p| describe(p).is_some())
            .filter(|p| expected_shape(p) != Some(Shape::Table))
            .map(<[Seg]>::to_vec);
        if let Some(parent) = scalar_parent {
            let node = tree_node(&parent);
            point = node.and_then(|n| n.span.clone()).or(point);
            problem = Problem::WrongType {
                found: node.map(|n| node_text(n, rep)),
                expected: String::new(),
            };
            path = parent;
        }
    }
    let stage = stage_of(tree, &path);
    let stage_name = stage.and_then(|(_, name)| name);
    // Inside a stage, keys are named relative to it; a stage without a name is numbered.
    let (relative, unnamed_prefix) = match stage {
        Some((i, name)) => (
            &path[2..],
            if name.is_none() {
                format!("stage #{}: ", i + 1)
            } else {
                String::new()
            },
        ),
        None => (&path[..], String::new()),
    };
    let (message, help) = match problem {
        Problem::UnknownField { field, expected } => {
            let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
            let place = match path.as_slice() {
                [] => " at the top level".to_string(),
                [Seg::Key(k), Seg::Index(_)] if k == "stage" => String::new(),
                _ => format!(" in `{}`", label(relative)),
            };
            let mut help = suggest::help(&field, &expected, "valid keys are");
            if path.is_empty() && STAGE_KEYS.contains(&field.as_str()) {
                help = "stage keys go below a `[[stage]]` header".into();
            } else if matches!(path.as_slice(), [Seg::Key(k)] if k == "run")
                && STAGE_KEYS.contains(&field.as_str())
            {
                help = format!("{help}; if `{field}` belongs to a stage, is a `[[stage]]` header missing above it?");
            }
            (
                format!("{unnamed_prefix}unknown key `{field}`{place}"),
                Some(help),
            )
        }
        Problem::MissingField(field) => {
            let message = match stage {
                Some(_) if relative.is_empty() => {
                    format!("{unnamed_prefix}the stage has no `{field}`")
                }
                _ => format!("{unnamed_prefix}`{}` has no `{field}`", label(relative)),
            };
            let help = (field == "name")
                .then(|| "every stage needs a unique `name`, like name = \"pretrain\"".to_string());
            (message, help)
        }
        Problem::DuplicateField(field) => {
            (format!("{unnamed_prefix}`{field}` is given twice"), None)
        }
        Problem::UnknownVariant { variant, expected } => {
            let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
            let what = label(relative);
            let mut help = suggest::help(&variant, &expected, "valid values are");
            if what == "kind" {
                help = format!(
                    "{}; to run any other program, give `command` instead",
                    suggest::help(&variant, &expected, "built-in kinds are")
                );
            }
            (
                format!("{unnamed_prefix}`{what}` cannot be `{variant}`"),
                Some(help),
            )
        }
        Problem::WrongType { found, expected } => {
            let want = describe(&path)
                .map(str::to_string)
                .unwrap_or_else(|| plain_expected(&expected));
            let too_large = matches!(expected.as_str(), "u32" | "u64")
                && found.as_deref().is_some_and(|f| f.parse::<u128>().is_ok());
            let what = if relative.is_empty() {
                if path.is_empty() {
                    "the plan".to_string()
                } else {
                    "each entry of `stage`".to_string()
                }
            } else {
                format!("`{}`", label(relative))
            };
            let unnamed_prefix = if relative.is_empty() {
                ""
            } else {
                unnamed_prefix.as_str()
            };
            let message = match found {
                _ if too_large => format!(
                    "{unnamed_prefix}{what} is too large (at most {})",
                    if expected == "u32" {
                        u64::from(u32::MAX)
                    } else {
                        u64::MAX
                    }
                ),
                Some(found) => format!("{unnamed_prefix}{what} must be {want}, not {found}"),
                None => format!("{unnamed_prefix}{what} must be {want}"),
            };
            let help = match path.as_slice() {
                [Seg::Key(k)] if k == "stage" => {
                    Some("write `[[stage]]` (double brackets) before each stage".to_string())
                }
                _ => None,
            };
            (message, help)
        }
        Problem::BadDuration(text) => (
            format!(
                "{unnamed_prefix}`{}` is not a valid duration: `{text}`",
                label(relative)
            ),
            Some(
                "write a number and a unit (ms, s, m, h, d), like \"90s\", \"30m\" or \"1h30m\""
                    .into(),
            ),
        ),
        Problem::Other(raw) => (
            format!("{unnamed_prefix}`{}`: {raw}", label(relative)),
            None,
        ),
    };
    rep.error(point, stage_name, message, help);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_serde_messages_apart() {
        assert_eq!(
            classify("unknown field `foo`, expected one of `name`, `after`"),
            Problem::UnknownField {
                field: "foo".into(),
                expected: vec!["name".into(), "after".into()]
            }
        );
        assert_eq!(
            classify("unknown variant `trian`, expected `train` or `eval`"),
            Problem::UnknownVariant {
                variant: "trian".into(),
                expected: vec!["train".into(), "eval".into()]
            }
        );
        assert_eq!(
            classify("invalid value: integer `-1`, expected u32"),
            Problem::WrongType {
                found: Some("-1".into()),
                expected: "u32".into()
            }
        );
        assert_eq!(
            classify("invalid type: string \"a, expected b\", expected a sequence"),
            Problem::WrongType {
                found: Some("the string \"a, expected b\"".into()),
                expected: "a sequence".into()
            }
        );
        assert_eq!(
            classify("missing field `name`"),
            Problem::MissingField("name".into())
        );
        assert_eq!(
            classify("something else"),
            Problem::Other("something else".into())
        );
    }
}
