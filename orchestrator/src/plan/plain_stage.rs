//! A `[[stage]]` table written in the plainest TOML, decoded without a TOML parser.
//!
//! A long written-out plan is thousands of tables like
//!
//! ```toml
//! [[stage]]
//! name = "s7"
//! command = ["python", "eval.py", "--sample", "7"]
//! after = ["s6"]
//! ```
//!
//! where every line is a bare key, `=`, and a basic string or a one-line list of them. For such
//! a table, building a `toml_edit` document (its spans, its formatting, its tree) was most of
//! what reading the plan cost (`bench/overhead/README.md` has the figures).
//! [`decode`] reads exactly this shape and hands the keys and strings to the same serde
//! decoder the document would reach, so a stage decodes to the same [`Stage`] with the same
//! defaults and the same refusals (an unknown key, a list where a string belongs).
//!
//! It answers only for tables it understands completely: any other line (a comment, a number,
//! an escape, an inline table, a multi-line string, a dotted or quoted key, a key given twice)
//! makes it answer `None`, and the caller decodes the table through `toml_edit` as before.
//! It never guesses: whatever it accepts is valid TOML that means the same to a TOML parser.

use protocol::plan::Stage;
use serde::de::value::{Error, MapDeserializer, SeqDeserializer, StrDeserializer};
use serde::de::{Deserializer, IntoDeserializer, Visitor};
use serde::Deserialize as _;

/// The stage `text` (a `[[stage]]` header and its keys) describes, when every line of it is
/// plain (see the module documentation) and the keys and values make a stage; else `None`.
pub(super) fn decode(text: &str) -> Option<Stage> {
    let entries = entries(text)?;
    Stage::deserialize(MapDeserializer::<_, Error>::new(entries.into_iter())).ok()
}

/// The keys and values of a plain `[[stage]]` table, in order; `None` for anything else.
fn entries(text: &str) -> Option<Vec<(&str, Plain<'_>)>> {
    // A carriage return is TOML only before a newline; the rest of the scan is simpler
    // without any.
    if text.contains('\r') {
        return None;
    }
    let mut lines = text
        .split('\n')
        .map(|line| line.trim_matches(TOML_SPACE))
        .filter(|line| !line.is_empty());
    if lines.next()? != "[[stage]]" {
        return None;
    }
    let mut entries: Vec<(&str, Plain<'_>)> = Vec::with_capacity(4);
    for line in lines {
        let (key, value) = key_value(line)?;
        if entries.iter().any(|(seen, _)| *seen == key) {
            return None;
        }
        entries.push((key, value));
    }
    Some(entries)
}

/// TOML's whitespace within a line: space and tab, nothing else.
const TOML_SPACE: [char; 2] = [' ', '\t'];

/// `key = value` with a bare key and a plain value, the line already trimmed.
fn key_value(line: &str) -> Option<(&str, Plain<'_>)> {
    let key_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .unwrap_or(line.len());
    let (key, rest) = line.split_at(key_end);
    if key.is_empty() {
        return None;
    }
    let rest = rest.trim_start_matches(TOML_SPACE).strip_prefix('=')?;
    let rest = rest.trim_start_matches(TOML_SPACE);
    let value = if let Some(list) = rest.strip_prefix('[') {
        Plain::List(list_of_strings(list)?)
    } else {
        let (text, after) = basic_string(rest)?;
        if !after.is_empty() {
            return None;
        }
        Plain::Text(text)
    };
    Some((key, value))
}

/// A basic string at the start of `text` (`"` included) and what follows it, with the
/// spaces after it skipped; `None` unless it is one without escapes or control characters.
fn basic_string(text: &str) -> Option<(&str, &str)> {
    let body = text.strip_prefix('"')?;
    let end = body.find('"')?;
    let content = &body[..end];
    if content.chars().any(|c| c == '\\' || c.is_ascii_control()) {
        return None;
    }
    Some((content, body[end + 1..].trim_start_matches(TOML_SPACE)))
}

/// The strings of a one-line list, from just after its `[` to the end of the line (which must
/// be its `]`); a trailing comma is allowed, as in TOML.
fn list_of_strings(mut rest: &str) -> Option<Vec<&str>> {
    let mut items = Vec::new();
    loop {
        rest = rest.trim_start_matches(TOML_SPACE);
        if let Some(after) = rest.strip_prefix(']') {
            return after.is_empty().then_some(items);
        }
        let (item, after) = basic_string(rest)?;
        items.push(item);
        rest = match after.strip_prefix(',') {
            Some(after) => after,
            None if after.starts_with(']') => after,
            None => return None,
        };
    }
}

/// A plain value: a string, or a list of strings.
#[derive(Debug, Clone, PartialEq)]
enum Plain<'a> {
    Text(&'a str),
    List(Vec<&'a str>),
}

impl<'de> IntoDeserializer<'de, Error> for Plain<'_> {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

/// A plain value meets the stage's decoder as TOML's own deserializer would present it: a
/// string or a sequence, `Some` for an optional field, itself inside a newtype, and a string
/// naming a unit variant for an enum.
impl<'de> Deserializer<'de> for Plain<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self {
            Plain::Text(text) => visitor.visit_str(text),
            Plain::List(items) => {
                visitor.visit_seq(SeqDeserializer::new(items.into_iter().map(Plain::Text)))
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self {
            Plain::Text(text) => {
                StrDeserializer::<Error>::new(text).deserialize_enum(name, variants, visitor)
            }
            list => list.deserialize_any(visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stage `text` decodes to through `toml_edit`, as the by-stage path decodes it.
    fn through_toml(text: &str) -> Option<Stage> {
        let plan: protocol::plan::Plan = toml::from_str(text).ok()?;
        let [stage] = <[_; 1]>::try_from(plan.stages).ok()?;
        Some(stage)
    }

    #[test]
    fn a_plain_stage_decodes_to_what_toml_decodes_it_to() {
        let mut decoded = 0;
        for text in [
            "[[stage]]\nname = \"s7\"\ncommand = [\"python\", \"eval.py\", \"--sample\", \"7\"]\n\
             after = [\"s6\"]\n",
            "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n",
            "  [[stage]]  \n\n\tname\t=\t\"é ü #1 'q'\"  \ncommand=[\"a\",\"b\",]\nafter = []\n\n",
            "[[stage]]\nname = \"w\"\ncommand = [ \"x\" ]\ntimeout = \"90s\"\nmemory = \"2GiB\"\n\
             outputs = [\"model.pt\"]\ninit = \"s0\"\nstall_timeout = \"5m\"\n",
            "[[stage]]\nname = \"k\"\nkind = \"train\"\nretry_on = [\"xid\", \"lost\"]\n",
            "[[stage]]\nname = \"e\"\ncommand = [\"true\"]\nretries = \"3\"\n",
        ] {
            let plain = decode(text);
            assert_eq!(plain, through_toml(text), "{text}");
            decoded += usize::from(plain.is_some());
        }
        // All but the last (a string where a number belongs, refused by both) decode.
        assert_eq!(decoded, 5);
    }

    #[test]
    fn anything_but_the_plainest_lines_is_left_to_toml() {
        for text in [
            "[[stage]]\nname = \"a\" # a comment\n",
            "[[stage]]\nname = \"a\\tb\"\n",
            "[[stage]]\nname = 'literal'\n",
            "[[stage]]\nname = \"\"\"multi\"\"\"\n",
            "[[stage]]\nname = \"a\"\nretries = 3\n",
            "[[stage]]\nname = \"a\"\nenv = { A = \"1\" }\n",
            "[[stage]]\nname = \"a\"\ncommand = [\n  \"true\",\n]\n",
            "[[stage]]\nname.x = \"a\"\n",
            "[[stage]]\n\"name\" = \"a\"\n",
            "[[stage]]\nname = \"a\"\nname = \"b\"\n",
            "[[stage]]\r\nname = \"a\"\r\n",
            "[[stage]]\nname = \"a\"\n[stage.params]\nx = \"1\"\n",
            "[[ stage ]]\nname = \"a\"\n",
            "[[stage]]\nname = \"a\" \"b\"\n",
            "[[stage]]\nname = \"a\u{a0}\"\u{a0}\n",
            "[[stage]]\nname = \"a\"\nunknown_key = \"x\"\n",
            "[[stage]]\nname = [\"a\"]\n",
        ] {
            assert_eq!(decode(text), None, "{text}");
        }
    }
}
