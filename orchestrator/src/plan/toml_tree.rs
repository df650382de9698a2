//! Reads a TOML document into a [`Node`] tree with byte spans.
//!
//! The spans are `toml_edit`'s, read through its public `span()` methods on a parsed
//! [`toml_edit::ImDocument`]: the same spans `toml`'s decoder puts on its errors, since it
//! decodes from that very document.

use super::tree::{Entry, Node, Value};
use std::ops::Range;
use toml_edit::{ImDocument, Item, TableLike};

/// Reads a TOML document into a tree, or `None` when it is not valid TOML.
#[cfg(test)]
pub(crate) fn from_toml(source: &str) -> Option<Node> {
    Some(of_document(&ImDocument::parse(source).ok()?))
}

/// The tree of a parsed TOML document (which the plan is then decoded from, so the text is
/// parsed once).
///
/// Every value, key and table written out in the text has its span; a table TOML creates
/// implicitly (`[stage.params.model]` without `[stage.params]`, dotted keys) has the extent of
/// what it holds; the root spans the whole text.
pub(crate) fn of_document(document: &ImDocument<&str>) -> Node {
    Node {
        span: Some(0..document.raw().len()),
        value: table(document.as_table()),
    }
}

/// An item: its own span when the text has one, else the extent of what it holds.
fn item(item: &Item) -> Node {
    let value = match item {
        Item::None => Value::Other,
        Item::Value(v) => return value(v),
        Item::Table(t) => table(t),
        Item::ArrayOfTables(tables) => Value::Array(tables.iter().map(item_of).collect()),
    };
    spanned(value, item.span())
}

/// A table of an array of tables, which is not an [`Item`] of its own.
fn item_of(table: &toml_edit::Table) -> Node {
    spanned(self::table(table), table.span())
}

fn value(value: &toml_edit::Value) -> Node {
    use toml_edit::Value as V;
    let shape = match value {
        V::String(s) => Value::String(s.value().clone()),
        V::Datetime(d) => Value::DateTime(d.value().to_string()),
        V::Integer(_) | V::Float(_) | V::Boolean(_) => Value::Other,
        V::Array(items) => Value::Array(items.iter().map(self::value).collect()),
        V::InlineTable(t) => table(t),
    };
    spanned(shape, value.span())
}

/// A table's entries in the order written, each key with its span.
fn table(table: &dyn TableLike) -> Value {
    Value::Table(
        table
            .iter()
            .map(|(key, node)| Entry {
                key: key.to_string(),
                key_span: table.key(key).and_then(|k| k.span()),
                node: item(node),
            })
            .collect(),
    )
}

/// `value` with `span`, or, for a container without one, the extent of what it holds.
fn spanned(value: Value, span: Option<Range<usize>>) -> Node {
    match span {
        Some(span) => Node {
            span: Some(span),
            value,
        },
        None => with_children_span(value),
    }
}

/// A container that has no span of its own gets the extent of what it holds.
fn with_children_span(value: Value) -> Node {
    let spans: Vec<&Range<usize>> = match &value {
        Value::Table(entries) => entries
            .iter()
            .flat_map(|e| [e.key_span.as_ref(), e.node.span.as_ref()])
            .flatten()
            .collect(),
        Value::Array(items) => items.iter().filter_map(|n| n.span.as_ref()).collect(),
        _ => Vec::new(),
    };
    let start = spans.iter().map(|s| s.start).min();
    let end = spans.iter().map(|s| s.end).max();
    Node {
        span: start.zip(end).map(|(s, e)| s..e),
        value,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tree::Seg;
    use super::*;

    fn key(k: &str) -> Seg {
        Seg::Key(k.into())
    }

    #[test]
    fn toml_tree_keeps_spans_of_values_and_keys() {
        let src = "[[stage]]\nname = \"a\"\n[stage.params]\nsteps = 3\n[[stage]]\nname = \"b\"\nafter = [\"a\", 1]\n";
        let tree = from_toml(src).unwrap();
        let name = tree
            .find(&[key("stage"), Seg::Index(1), key("name")])
            .unwrap();
        assert_eq!(&src[name.span.clone().unwrap()], "\"b\"");
        assert_eq!(name.as_str(), Some("b"));
        let steps = tree
            .find(&[key("stage"), Seg::Index(0), key("params"), key("steps")])
            .unwrap();
        assert_eq!(&src[steps.span.clone().unwrap()], "3");
        let after1 = tree
            .find(&[key("stage"), Seg::Index(1), key("after"), Seg::Index(1)])
            .unwrap();
        assert_eq!(&src[after1.span.clone().unwrap()], "1");
        let loc = tree.locate(&after1.span.clone().unwrap()).unwrap();
        assert_eq!(
            loc.path,
            vec![key("stage"), Seg::Index(1), key("after"), Seg::Index(1)]
        );
        assert!(!loc.on_key);
        let steps_key = src.find("steps").unwrap();
        let loc = tree.locate(&(steps_key..steps_key + 5)).unwrap();
        assert_eq!(
            loc.path,
            vec![key("stage"), Seg::Index(0), key("params"), key("steps")]
        );
        assert!(loc.on_key);
    }

    #[test]
    fn implicit_tables_and_datetimes_keep_the_spans_around_them() {
        let src = "[[stage]]\nname = \"a\"\nwhen = 1979-05-27T07:32:00Z\n[stage.params.model]\nd_model = 64\n[[stage]]\nname = \"b\"\nparams.x.y = 1\n";
        let tree = from_toml(src).unwrap();
        let stage0 = tree.find(&[key("stage"), Seg::Index(0)]).unwrap();
        let when = stage0.get("when").unwrap();
        assert!(matches!(&when.value, Value::DateTime(text) if text == "1979-05-27T07:32:00Z"));
        assert_eq!(&src[when.span.clone().unwrap()], "1979-05-27T07:32:00Z");
        let params = stage0.get("params").unwrap();
        let d_model = params.find(&[key("model"), key("d_model")]).unwrap();
        assert_eq!(&src[d_model.span.clone().unwrap()], "64");
        let model_key = params.entry("model").unwrap().key_span.clone().unwrap();
        assert_eq!(&src[model_key], "model");
        assert!(params.span.is_some());
        let y = tree
            .find(&[
                key("stage"),
                Seg::Index(1),
                key("params"),
                key("x"),
                key("y"),
            ])
            .unwrap();
        assert_eq!(&src[y.span.clone().unwrap()], "1");
    }

    #[test]
    fn invalid_toml_gives_no_tree() {
        assert!(from_toml("a = = 1").is_none());
        assert!(from_toml("").is_some());
    }
}
