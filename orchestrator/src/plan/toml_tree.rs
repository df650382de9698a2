//! Reads a TOML document into a [`Node`] tree with byte spans.

use super::tree::{Entry, Node, Value};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;
use std::ops::Range;

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
