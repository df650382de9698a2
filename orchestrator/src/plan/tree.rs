//! A second reading of the plan's text that keeps where every key and value is.
//!
//! The typed [`protocol::plan::Plan`] forgets positions; this tree remembers the byte span of
//! each value and table key, so that a problem found later can point at the exact text. It is
//! built from TOML by `toml_tree` and from JSON by `json_tree`. It accepts any document shape:
//! nothing here refuses a key or a type.

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
    /// A TOML date-time, as written (its canonical text).
    DateTime(String),
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

    /// Every entry of this table by its key (the first, should a key be there twice), for
    /// looking up many keys at once: one pass over the table instead of one per key.
    /// Empty for anything but a table.
    pub fn entries_by_key(&self) -> std::collections::HashMap<&str, &Entry> {
        let mut index = std::collections::HashMap::new();
        if let Value::Table(entries) = &self.value {
            index.reserve(entries.len());
            for entry in entries {
                index.entry(entry.key.as_str()).or_insert(entry);
            }
        }
        index
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
            Value::String(_) | Value::DateTime(_) | Value::Other => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::json_tree::from_json;
    use super::*;

    fn key(k: &str) -> Seg {
        Seg::Key(k.into())
    }

    #[test]
    fn locate_finds_the_innermost_value_or_key() {
        let src = r#"{"stage": [{"name": "a", "after": ["b", "c"]}]}"#;
        let tree = from_json(src).unwrap();
        let c = src.find("\"c\"").unwrap();
        let found = tree.locate(&(c + 1..c + 2)).unwrap();
        assert_eq!(
            found.path,
            [key("stage"), Seg::Index(0), key("after"), Seg::Index(1)]
        );
        assert!(!found.on_key);
        assert_eq!(found.span, c..c + 3);
        let after = src.find("\"after\"").unwrap();
        let found = tree.locate(&(after..after + 1)).unwrap();
        assert_eq!(found.path, [key("stage"), Seg::Index(0), key("after")]);
        assert!(found.on_key);
        let found = tree.locate(&(0..1)).unwrap();
        assert!(found.path.is_empty());
        assert!(tree.locate(&(src.len() + 5..src.len() + 6)).is_none());
    }

    #[test]
    fn paths_lead_to_nodes() {
        let tree = from_json(r#"{"run": {"name": "x"}, "stage": []}"#).unwrap();
        assert_eq!(
            tree.find(&[key("run"), key("name")]).and_then(Node::as_str),
            Some("x")
        );
        assert!(tree.find(&[key("stage"), Seg::Index(0)]).is_none());
        assert!(tree.find(&[key("run"), Seg::Index(0)]).is_none());
        assert!(tree.get("nope").is_none());
    }
}
