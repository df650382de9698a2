//! Reading serde's error messages ("invalid value: integer `-1`, expected u32") apart, so
//! that they can be said again in the plan's own words.
//!
//! Kept on purpose, rather than replaced by `serde_path_to_error`: that crate tells *where* a
//! decoding error happened (a path of keys) and hands back the decoder's error unchanged, so
//! *what* went wrong (which field, which variants were expected, what was found) would still
//! have to be read from this same English text. Where is already known here, more precisely,
//! from the byte span `toml` and `serde_json` put on their errors (see `explain`). The texts
//! read are serde's own (`serde::de::Error`'s provided `unknown_field`, `invalid_type`, …),
//! not a decoder's, and a message this module does not recognise is passed on verbatim
//! ([`Problem::Other`]), so a change of wording loses the plain rewording, never the error.
//! Doing without the text would take a decoder whose own error type receives those calls
//! structurally (a deserializer over the spanned tree), a larger change than this module.

/// What a serde error message says, taken apart.
#[derive(Debug, PartialEq)]
pub(crate) enum Problem {
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

pub(crate) fn classify(raw: &str) -> Problem {
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
    if raw.contains("untagged enum MatrixAxis") {
        return Problem::WrongType {
            found: None,
            expected: "a list of values, `{ lines = \"FILE\" }` or `{ glob = \"PATTERN\" }`".into(),
        };
    }
    if raw.contains("untagged enum MatrixValue") {
        return Problem::WrongType {
            found: None,
            expected: "a number, a boolean or text".into(),
        };
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
pub(crate) fn shorten(text: &str) -> String {
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
pub(crate) fn plain_expected(expected: &str) -> String {
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

/// For a type error message from serde: what was wanted, in words, and what was found.
pub(crate) fn type_problem(raw: &str) -> Option<(String, Option<String>)> {
    match classify(raw) {
        Problem::WrongType { found, expected } => Some((plain_expected(&expected), found)),
        _ => None,
    }
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
