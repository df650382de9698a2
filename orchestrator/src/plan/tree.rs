//! A second reading of the plan's text that keeps where every key and value is.
//!
//! The typed [`protocol::plan::Plan`] forgets positions; this tree remembers the byte span of
//! each value and table key, so that a problem found later can point at the exact text. It is
//! built from TOML through the protocol of `toml::Spanned` (see [`from_toml`]) and from JSON by a small scanner
//! (`json_tree`). It accepts any document shape: nothing here refuses a key or a type.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;
use std::ops::Range;

/// A value of the document and the byte range of its text.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    /// The byte range of the value's text; for a TOML table created implicitly, the extent of
    /// its contents; `None` if not known.
    pub span: Option<Range<usize>>,
    pub value: Value,
}

/// The shape of a [`Node`]; only what positions and messages need is kept.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    Table(Vec<Entry>),
    Array(Vec<Node>),
    String(String),
    DateTime,
    Other,
}

/// One key of a table, with the span of the key's own text when known.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub key: String,
    pub key_span: Option<Range<usize>>,
    pub node: Node,
}

/// One step of a path from the root of a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// What [`Node::locate`] found at a span: the path to the innermost value, and whether the span
/// is the text of the last key rather than of its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Location {
    pub path: Vec<Seg>,
    pub on_key: bool,
    /// The span of the key or value found.
    pub span: Range<usize>,
}

impl Node {
    /// The value of `key`, if this is a table that has it.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.entry(key).map(|e| &e.node)
    }

    /// The entry of `key`, if this is a table that has it.
    pub fn entry(&self, key: &str) -> Option<&Entry> {
        match &self.value {
            Value::Table(entries) => entries.iter().find(|e| e.key == key),
            _ => None,
        }
    }

    /// Element `index`, if this is an array that long.
    pub fn at(&self, index: usize) -> Option<&Node> {
        match &self.value {
            Value::Array(items) => items.get(index),
            _ => None,
        }
    }

    /// The text, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The node at the end of `path`.
    pub fn find(&self, path: &[Seg]) -> Option<&Node> {
        path.iter().try_fold(self, |node, seg| match seg {
            Seg::Key(key) => node.get(key),
            Seg::Index(i) => node.at(*i),
        })
    }

    /// The innermost key or value whose text covers all of `span`.
    ///
    /// Parents' spans need not cover their children (a TOML `[[stage]]` table's span ends where
    /// its `[stage.params]` sub-table begins), so the whole tree is searched.
    pub fn locate(&self, span: &Range<usize>) -> Option<Location> {
        let mut best: Option<(usize, Location)> = None;
        let mut path = Vec::new();
        self.search(span, &mut path, &mut best);
        best.map(|(_, location)| location)
    }

    fn search(
        &self,
        span: &Range<usize>,
        path: &mut Vec<Seg>,
        best: &mut Option<(usize, Location)>,
    ) {
        fn consider(
            candidate: &Range<usize>,
            span: &Range<usize>,
            path: &[Seg],
            on_key: bool,
            best: &mut Option<(usize, Location)>,
        ) {
            let covers = candidate.start <= span.start
                && (span.end <= candidate.end || (span.is_empty() && span.start == candidate.end));
            let len = candidate.end - candidate.start;
            if covers && best.as_ref().is_none_or(|(b, _)| len <= *b) {
                *best = Some((
                    len,
                    Location {
                        path: path.to_vec(),
                        on_key,
                        span: candidate.clone(),
                    },
                ));
            }
        }
        if let Some(own) = &self.span {
            consider(own, span, path, false, best);
        }
        match &self.value {
            Value::Table(entries) => {
                for entry in entries {
                    path.push(Seg::Key(entry.key.clone()));
                    if let Some(key_span) = &entry.key_span {
                        consider(key_span, span, path, true, best);
                    }
                    entry.node.search(span, path, best);
                    path.pop();
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    path.push(Seg::Index(i));
                    item.search(span, path, best);
                    path.pop();
                }
            }
            Value::String(_) | Value::DateTime | Value::Other => {}
        }
    }
}

/// Reads a TOML document into a tree, or `None` when it is not valid TOML.
pub(crate) fn from_toml(source: &str) -> Option<Node> {
    let Bare(value) = toml::from_str(source).ok()?;
    Some(Node {
        span: Some(0..source.len()),
        value,
    })
}

// `toml::Spanned<T>` fails outright on a value that has no span of its own, which is the case
// of the tables TOML creates implicitly (`[stage.params.model]` without `[stage.params]`,
// dotted keys) and of the parts of a date-time. So this module speaks the protocol that
// `Spanned` speaks (these names are serde_spanned 0.6's, which toml 0.8 answers to) and reads
// a value without a span when the deserializer offers none. Were the protocol ever to change,
// values would come back without spans: messages would lose positions, nothing would fail.
const SPANNED: &str = "$__serde_spanned_private_Spanned";
const START: &str = "$__serde_spanned_private_start";
const END: &str = "$__serde_spanned_private_end";
const VALUE: &str = "$__serde_spanned_private_value";
const SPANNED_FIELDS: &[&str] = &[START, END, VALUE];
/// The key under which toml hands over a date-time.
const DATETIME: &str = "$__toml_private_datetime";

/// A value whose span, if any, its container knows.
struct Bare(Value);

/// A value with its span when the deserializer has one.
struct WithSpan(Node);

/// A table key with its span when the deserializer has one.
struct Key {
    text: String,
    span: Option<Range<usize>>,
}

impl<'de> Deserialize<'de> for Bare {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(ValueVisitor { spanned: false })
            .map(|node| Bare(node.value))
    }
}

impl<'de> Deserialize<'de> for WithSpan {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_struct(SPANNED, SPANNED_FIELDS, ValueVisitor { spanned: true })
            .map(WithSpan)
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct(SPANNED, SPANNED_FIELDS, KeyVisitor)
    }
}

/// Reads the rest of the spanned protocol after its first key: end, then the value.
fn spanned_rest<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    map: &mut A,
) -> Result<(Range<usize>, T), A::Error> {
    let start: usize = map.next_value()?;
    map.next_key::<de::IgnoredAny>()?;
    let end: usize = map.next_value()?;
    map.next_key::<de::IgnoredAny>()?;
    let value: T = map.next_value()?;
    Ok((start..end, value))
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(Key {
            text: v.to_string(),
            span: None,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Key, A::Error> {
        match map.next_key::<String>()?.as_deref() {
            Some(START) => {
                let (span, text) = spanned_rest::<A, String>(&mut map)?;
                Ok(Key {
                    text,
                    span: Some(span),
                })
            }
            _ => Err(de::Error::custom("a key that is a table")),
        }
    }
}

/// Reads any TOML value; with `spanned`, it was asked for through the spanned protocol and may
/// receive it.
struct ValueVisitor {
    spanned: bool,
}

fn unspanned(value: Value) -> Node {
    Node { span: None, value }
}

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any TOML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
        Ok(unspanned(Value::Other))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
        Ok(unspanned(Value::Other))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
        Ok(unspanned(Value::Other))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
        Ok(unspanned(Value::Other))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(unspanned(Value::String(v.to_string())))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(WithSpan(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(with_children_span(Value::Array(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let Some(first) = map.next_key::<Key>()? else {
            return Ok(unspanned(Value::Table(Vec::new())));
        };
        if self.spanned && first.text == START {
            let (span, Bare(value)) = spanned_rest::<A, Bare>(&mut map)?;
            return Ok(Node {
                span: Some(span),
                value,
            });
        }
        if first.text == DATETIME {
            map.next_value::<de::IgnoredAny>()?;
            return Ok(unspanned(Value::DateTime));
        }
        let mut entries = Vec::new();
        let mut key = Some(first);
        while let Some(Key { text, span }) = key {
            let WithSpan(node) = map.next_value()?;
            entries.push(Entry {
                key: text,
                key_span: span,
                node,
            });
            key = map.next_key()?;
        }
        Ok(with_children_span(Value::Table(entries)))
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
        assert!(matches!(when.value, Value::DateTime));
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
