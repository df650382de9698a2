//! Decoding the text into [`Plan`]: the first syntax or type error stops it.
//!
//! Its position comes from the decoder (a byte span from `toml`, a line and byte column from
//! `serde_json`); the wording comes from [`explain`](super::explain).

use super::diagnostic::Reporter;
use super::expect::{node_text, shape_mistake, stage_of};
use super::explain::data_error;
use super::tree::{Node, Seg, Value};
use protocol::plan::{Plan, Stage};

/// Decodes TOML text, reporting the first syntax or type error. `document` is the text
/// parsed (`None` if it is not valid TOML) and `tree` its tree.
pub(crate) fn toml_plan(
    source: &str,
    document: Option<toml_edit::ImDocument<&str>>,
    tree: Option<&Node>,
    rep: &mut Reporter,
) -> Option<Plan> {
    let decoded = match document {
        Some(document) => {
            <Plan as serde::Deserialize>::deserialize(toml_edit::de::Deserializer::from(document))
                .map_err(|e| (e.message().to_string(), e.span()))
        }
        None => toml::from_str::<Plan>(source).map_err(|e| (e.message().to_string(), e.span())),
    };
    let (message, span) = match decoded {
        Ok(mut plan) => {
            if let Some(tree) = tree {
                datetimes_to_strings(&mut plan, tree);
            }
            return tables_are_tables(plan, tree, rep);
        }
        Err(error) => error,
    };
    if toml::from_str::<toml::Table>(source).is_err() {
        let mut lines = message.lines().map(str::trim).filter(|l| !l.is_empty());
        let mut message = format!("invalid TOML: {}", lines.next().unwrap_or("syntax error"));
        for line in lines {
            message.push_str(", ");
            message.push_str(line);
        }
        let help = (message.contains("duplicate key `stage`"))
            .then(|| "write `[[stage]]` (double brackets) before each stage".to_string());
        rep.error(span, None, message, help);
    } else {
        data_error(&message, span.clone(), tree, rep);
        if let Ok(table) = toml::from_str::<toml::Table>(source) {
            let stages: Vec<Result<Stage, String>> = match table.get("stage") {
                Some(toml::Value::Array(items)) => items
                    .iter()
                    .map(|v| {
                        v.clone()
                            .try_into::<Stage>()
                            .map_err(|e| e.message().to_string())
                    })
                    .collect(),
                _ => Vec::new(),
            };
            let names = stage_names(table.get("stage").and_then(|s| s.as_array()).map(|a| {
                a.iter()
                    .map(|v| v.get("name").and_then(|n| n.as_str()).map(str::to_string))
                    .collect()
            }));
            report_other_stages(&stages, &names, span, tree, rep);
        }
    }
    None
}

fn stage_names(names: Option<Vec<Option<String>>>) -> Vec<Option<String>> {
    names.unwrap_or_default()
}

/// After the first type error (which the decoder stops at), every other stage is decoded on
/// its own, so that one `validate` lists the problems of all of them; they are named by stage
/// (their positions are not known this way).
fn report_other_stages(
    stages: &[Result<Stage, String>],
    names: &[Option<String>],
    first: Option<std::ops::Range<usize>>,
    tree: Option<&Node>,
    rep: &mut Reporter,
) {
    let first_stage = tree
        .zip(first.as_ref())
        .and_then(|(t, s)| t.locate(s))
        .and_then(|location| stage_of(tree, &location.path).map(|(i, _)| i));
    for (i, decoded) in stages.iter().enumerate() {
        if Some(i) == first_stage {
            continue;
        }
        if let Err(why) = decoded {
            let label = names
                .get(i)
                .cloned()
                .flatten()
                .unwrap_or_else(|| format!("#{}", i + 1));
            rep.error(None, Some(&label), why.clone(), None);
        }
    }
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
    let other_stages = |span: Option<std::ops::Range<usize>>, rep: &mut Reporter| {
        let Ok(doc) = serde_json::from_str::<serde_json::Value>(source) else {
            return;
        };
        let items = doc
            .get("stage")
            .and_then(|s| s.as_array())
            .cloned()
            .unwrap_or_default();
        let stages: Vec<Result<Stage, String>> = items
            .iter()
            .map(|v| serde_json::from_value::<Stage>(v.clone()).map_err(|e| e.to_string()))
            .collect();
        let names: Vec<Option<String>> = items
            .iter()
            .map(|v| v.get("name").and_then(|n| n.as_str()).map(str::to_string))
            .collect();
        report_other_stages(&stages, &names, span, tree, rep);
    };
    match error.classify() {
        serde_json::error::Category::Data => {
            data_error(&message, span.clone(), tree, rep);
            other_stages(span, rep);
        }
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

/// A stage's `params` are handed to the stage as JSON, which has no date-time: each TOML
/// date-time in them becomes its text. Where they are is read from the document's tree (the
/// decoder's own representation of a date-time inside a JSON value is private to `toml`).
fn datetimes_to_strings(plan: &mut Plan, tree: &Node) {
    let Some(Value::Array(stages)) = tree.get("stage").map(|s| &s.value) else {
        return;
    };
    for (stage, node) in plan.stages.iter_mut().zip(stages) {
        let Some(Value::Table(entries)) = node.get("params").map(|p| &p.value) else {
            continue;
        };
        for entry in entries {
            if let Some(value) = stage.params.get_mut(&entry.key) {
                replace_datetimes(value, &entry.node);
            }
        }
    }
}

/// Walks a JSON value and the tree node it was decoded from side by side.
fn replace_datetimes(value: &mut serde_json::Value, node: &Node) {
    use serde_json::Value as J;
    match (&node.value, value) {
        (Value::DateTime(text), value) => *value = J::String(text.clone()),
        (Value::Table(entries), J::Object(map)) => {
            for entry in entries {
                if let Some(value) = map.get_mut(&entry.key) {
                    replace_datetimes(value, &entry.node);
                }
            }
        }
        (Value::Array(nodes), J::Array(items)) => {
            for (value, node) in items.iter_mut().zip(nodes) {
                replace_datetimes(value, node);
            }
        }
        _ => {}
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::toml_tree;
    use serde_json::json;

    #[test]
    fn datetimes_in_params_become_their_text_and_nothing_else_changes() {
        let source = r#"
[[stage]]
name = "a"
command = ["true"]
[stage.params]
when = 1979-05-27T07:32:00Z
day = 2026-11-30
list = [1, 07:32:00, "x"]
nested = { at = 1979-05-27T00:32:00.999-07:00, n = 1 }
text = "1979-05-27"
"#;
        let document = toml_edit::ImDocument::parse(source).ok();
        let tree = document.as_ref().map(toml_tree::of_document);
        let mut rep = Reporter::new(source, "plan.toml");
        let plan = toml_plan(source, document, tree.as_ref(), &mut rep).expect("decodes");
        assert_eq!(
            serde_json::Value::Object(plan.stages[0].params.clone()),
            json!({
                "when": "1979-05-27T07:32:00Z",
                "day": "2026-11-30",
                "list": [1, "07:32:00", "x"],
                "nested": {"at": "1979-05-27T00:32:00.999-07:00", "n": 1},
                "text": "1979-05-27",
            })
        );
    }
}
