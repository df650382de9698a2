//! Reads a JSON document into a [`Node`] tree with byte spans.
//!
//! `serde_json` keeps no positions, so this small recursive-descent scanner finds them. It is
//! only asked about text `serde_json` has accepted, but refuses anything malformed by returning
//! `None` rather than panicking, and stops at a nesting depth well above serde_json's own limit.

use super::tree::{Entry, Node, Value};

const MAX_DEPTH: usize = 256;

/// The tree of a JSON document, or `None` if the text is not one JSON value.
pub(crate) fn from_json(source: &str) -> Option<Node> {
    let mut scanner = Scanner {
        text: source,
        bytes: source.as_bytes(),
        pos: 0,
    };
    let node = scanner.value(0)?;
    scanner.skip_ws();
    (scanner.pos == scanner.bytes.len()).then_some(node)
}

/// A key an object of the document names twice: the key, where it first is and where again.
pub(crate) struct DuplicateKey {
    pub key: String,
    pub first: Option<std::ops::Range<usize>>,
    pub again: Option<std::ops::Range<usize>>,
}

/// Every key that an object of the tree names more than once, in document order.
/// (`serde_json` would keep the last value silently; TOML refuses them.)
pub(crate) fn duplicate_keys(node: &Node) -> Vec<DuplicateKey> {
    let mut found = Vec::new();
    let mut stack = vec![node];
    while let Some(node) = stack.pop() {
        match &node.value {
            Value::Table(entries) => {
                let mut seen: std::collections::HashMap<&str, &Entry> = Default::default();
                for entry in entries {
                    match seen.get(entry.key.as_str()) {
                        Some(first) => found.push(DuplicateKey {
                            key: entry.key.clone(),
                            first: first.key_span.clone(),
                            again: entry.key_span.clone(),
                        }),
                        None => {
                            seen.insert(&entry.key, entry);
                        }
                    }
                }
                stack.extend(entries.iter().rev().map(|e| &e.node));
            }
            Value::Array(items) => stack.extend(items.iter().rev()),
            _ => {}
        }
    }
    found.sort_by_key(|d| d.again.as_ref().map(|r| r.start));
    found
}

struct Scanner<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl Scanner<'_> {
    fn skip_ws(&mut self) {
        while matches!(self.bytes.get(self.pos), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&byte) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Option<Node> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.skip_ws();
        let start = self.pos;
        let value = match *self.bytes.get(self.pos)? {
            b'{' => self.object(depth)?,
            b'[' => self.array(depth)?,
            b'"' => Value::String(self.string()?),
            _ => {
                while let Some(b) = self.bytes.get(self.pos) {
                    if matches!(
                        b,
                        b',' | b']' | b'}' | b':' | b' ' | b'\t' | b'\n' | b'\r' | b'"'
                    ) {
                        break;
                    }
                    self.pos += 1;
                }
                if self.pos == start {
                    return None;
                }
                Value::Other
            }
        };
        Some(Node {
            span: Some(start..self.pos),
            value,
        })
    }

    fn object(&mut self, depth: usize) -> Option<Value> {
        self.pos += 1;
        let mut entries = Vec::new();
        if self.eat(b'}') {
            return Some(Value::Table(entries));
        }
        loop {
            self.skip_ws();
            let key_start = self.pos;
            if self.bytes.get(self.pos) != Some(&b'"') {
                return None;
            }
            let key = self.string()?;
            let key_span = key_start..self.pos;
            if !self.eat(b':') {
                return None;
            }
            let node = self.value(depth + 1)?;
            entries.push(Entry {
                key,
                key_span: Some(key_span),
                node,
            });
            if self.eat(b'}') {
                return Some(Value::Table(entries));
            }
            if !self.eat(b',') {
                return None;
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<Value> {
        self.pos += 1;
        let mut items = Vec::new();
        if self.eat(b']') {
            return Some(Value::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            if self.eat(b']') {
                return Some(Value::Array(items));
            }
            if !self.eat(b',') {
                return None;
            }
        }
    }

    /// A string token starting at the current `"`; its text with escapes resolved.
    fn string(&mut self) -> Option<String> {
        let start = self.pos;
        self.pos += 1;
        loop {
            match *self.bytes.get(self.pos)? {
                b'"' => break,
                b'\\' => self.pos += 2,
                _ => self.pos += 1,
            }
        }
        self.pos += 1;
        let token = self.text.get(start..self.pos)?;
        serde_json::from_str(token).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tree::Seg;
    use super::*;

    #[test]
    fn spans_of_json_values_and_keys() {
        let src = r#"{"stage": [{"name": "a\"b", "after": ["x", 1.5e3]}], "run": {}}"#;
        let tree = from_json(src).unwrap();
        let name = tree
            .find(&[
                Seg::Key("stage".into()),
                Seg::Index(0),
                Seg::Key("name".into()),
            ])
            .unwrap();
        assert_eq!(name.as_str(), Some("a\"b"));
        assert_eq!(&src[name.span.clone().unwrap()], r#""a\"b""#);
        let num = tree
            .find(&[
                Seg::Key("stage".into()),
                Seg::Index(0),
                Seg::Key("after".into()),
                Seg::Index(1),
            ])
            .unwrap();
        assert_eq!(&src[num.span.clone().unwrap()], "1.5e3");
    }

    #[test]
    fn keys_named_twice_are_found_at_any_depth_with_both_places() {
        let text = r#"{"stage":[{"name":"a","env":{"A":"1","B":"2","A":"3"}}],"stage":[]}"#;
        let tree = from_json(text).unwrap();
        let found = duplicate_keys(&tree);
        let keys: Vec<&str> = found.iter().map(|d| d.key.as_str()).collect();
        assert_eq!(keys, ["A", "stage"]);
        let again = found[0].again.clone().unwrap();
        assert_eq!(&text[again], "\"A\"");
        assert!(found[0].first.as_ref().unwrap().start < found[0].again.as_ref().unwrap().start);
        assert!(
            duplicate_keys(&from_json(r#"{"a":{"a":1},"b":[{"a":1},{"a":2}]}"#).unwrap())
                .is_empty()
        );
    }

    #[test]
    fn malformed_json_gives_none() {
        for bad in ["", "{", "[1,]", "{\"a\" 1}", "\"abc", "{\"a\":1}x", "\"\\"] {
            assert!(from_json(bad).is_none(), "{bad}");
        }
        let deep = "[".repeat(10_000);
        assert!(from_json(&deep).is_none());
    }
}
