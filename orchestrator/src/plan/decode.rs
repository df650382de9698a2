//! Decoding the text into [`Plan`]: the first syntax or type error stops it.
//!
//! Its position comes from the decoder (a byte span from `toml`, a line and byte column from
//! `serde_json`); the wording comes from [`explain`](super::explain).

use super::diagnostic::{LineIndex, Reporter};
use super::expect::{node_text, shape_mistake, stage_of};
use super::explain::data_error;
use super::tree::{Node, Seg, Value};
use protocol::plan::{Plan, Stage};
use std::ops::Range;

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
        report_other_stages(&toml_stages(source), span, tree, rep);
    }
    None
}

/// One stage of a plan decoded on its own: its name, and, when it does not decode, the
/// decoder's message and the byte span of the plan's text it is about (when known).
struct StageDecoded {
    name: Option<String>,
    error: Option<(String, Option<Range<usize>>)>,
}

/// Every stage of a TOML plan decoded on its own, from the parsed document, whose values keep
/// their spans: an error points into the plan's text as the first one does.
fn toml_stages(source: &str) -> Vec<StageDecoded> {
    use serde::de::IntoDeserializer;
    use toml_edit::{Item, Value as TomlValue};
    let Ok(document) = toml_edit::ImDocument::parse(source) else {
        return Vec::new();
    };
    // `[[stage]]` tables become inline tables (their values keep their spans), so that each
    // decodes as a value; `stage = [{ … }]` is one already.
    let stages: Vec<TomlValue> = match document.get("stage") {
        Some(Item::ArrayOfTables(tables)) => tables
            .iter()
            .map(|t| TomlValue::InlineTable(t.clone().into_inline_table()))
            .collect(),
        Some(Item::Value(TomlValue::Array(items))) => items.iter().cloned().collect(),
        _ => Vec::new(),
    };
    stages
        .into_iter()
        .map(|stage| {
            let name = stage
                .as_inline_table()
                .and_then(|t| t.get("name"))
                .and_then(TomlValue::as_str)
                .map(str::to_string);
            let error = <Stage as serde::Deserialize>::deserialize(stage.into_deserializer())
                .err()
                .map(|e| (e.message().to_string(), e.span()));
            StageDecoded { name, error }
        })
        .collect()
}

/// Every stage of a JSON plan decoded on its own, from its own text (the tree says where each
/// is), so that an error's line and column lead back into the plan's text.
fn json_stages(source: &str, tree: Option<&Node>) -> Vec<StageDecoded> {
    let Some(Value::Array(items)) = tree.and_then(|t| t.get("stage")).map(|s| &s.value) else {
        return Vec::new();
    };
    items
        .iter()
        .map(|node| {
            let name = node.get("name").and_then(Node::as_str).map(str::to_string);
            let error = node.span.clone().and_then(|span| {
                let text = source.get(span.clone())?;
                let error = serde_json::from_str::<Stage>(text).err()?;
                let (message, at) = json_error(&error, text, &LineIndex::new(text));
                Some((
                    message,
                    at.map(|r| r.start + span.start..r.end + span.start),
                ))
            });
            StageDecoded { name, error }
        })
        .collect()
}

/// After the first type error (which the decoder stops at), every other stage is decoded on
/// its own, so that one `validate` lists the problems of all of them, each in the plan's words
/// at its place (named by stage only where its position is not known).
fn report_other_stages(
    stages: &[StageDecoded],
    first: Option<Range<usize>>,
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
        match &decoded.error {
            Some((why, Some(span))) if tree.is_some() => {
                data_error(why, Some(span.clone()), tree, rep)
            }
            Some((why, _)) => {
                let label = decoded
                    .name
                    .clone()
                    .unwrap_or_else(|| format!("#{}", i + 1));
                rep.error(None, Some(&label), why.clone(), None);
            }
            None => {}
        }
    }
}

/// serde_json's error without its " at line L column C" and the byte span it is about in
/// `source` (whose line index is `index`).
fn json_error(
    error: &serde_json::Error,
    source: &str,
    index: &LineIndex,
) -> (String, Option<Range<usize>>) {
    let full = error.to_string();
    let suffix = format!(" at line {} column {}", error.line(), error.column());
    let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
    // serde_json's column is that of the last byte it read: inside the offending token, or,
    // when it only peeked at a value (a table where a string belongs), just before it.
    let mut offset = index.offset_of(error.line(), error.column().max(1));
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
    (message, span)
}

/// Decodes JSON text, reporting the first syntax or type error.
pub(crate) fn json_plan(source: &str, tree: Option<&Node>, rep: &mut Reporter) -> Option<Plan> {
    let error = match serde_json::from_str::<Plan>(source) {
        Ok(plan) => return tables_are_tables(plan, tree, rep),
        Err(error) => error,
    };
    let (message, span) = json_error(&error, source, rep.index());
    let valid_json = || serde_json::from_str::<serde::de::IgnoredAny>(source).is_ok();
    let other_stages = |span: Option<Range<usize>>, rep: &mut Reporter| {
        report_other_stages(&json_stages(source, tree), span, tree, rep);
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
