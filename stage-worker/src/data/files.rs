//! Data sets from files the user names: JSONL prompt/completion pairs or plain text.

use super::{Dataset, Example};
use crate::failure::{Failure, StageResult};
use serde::Deserialize;
use std::path::Path;

/// One JSONL line. Other fields (an id, a source) are allowed and ignored.
#[derive(Deserialize)]
struct PairLine {
    prompt: String,
    completion: String,
}

/// Loads `path` (relative paths are relative to the working directory): `*.jsonl` as
/// prompt/completion pairs, anything else as plain text. Errors name the file, and for JSONL
/// the line, and say what is wrong.
pub fn load_file(path: &Path) -> StageResult<Dataset> {
    let bytes = std::fs::read(path).map_err(|e| {
        let cwd = std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|_| "?".into());
        Failure::bad_input(format!(
            "data file {} cannot be read: {e} (relative paths are taken from the working directory {cwd})",
            path.display()
        ))
    })?;
    let is_jsonl = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("jsonl"));
    if is_jsonl {
        parse_jsonl(path, &bytes).map(Dataset::Pairs)
    } else if bytes.is_empty() {
        Err(Failure::bad_input(format!(
            "data file {} is empty",
            path.display()
        )))
    } else {
        Ok(Dataset::Text(bytes))
    }
}

/// Parses JSONL prompt/completion pairs; blank lines are skipped.
pub fn parse_jsonl(path: &Path, bytes: &[u8]) -> StageResult<Vec<Example>> {
    let mut examples = Vec::new();
    for (index, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line_no = index + 1;
        let at = || format!("{}:{line_no}", path.display());
        let line = std::str::from_utf8(raw)
            .map_err(|e| Failure::bad_input(format!("{}: not UTF-8 ({e})", at())))?;
        if line.trim().is_empty() {
            continue;
        }
        let pair: PairLine = serde_json::from_str(line).map_err(|e| {
            Failure::bad_input(format!(
                "{}: expected a JSON object with string fields \"prompt\" and \"completion\": {e}",
                at()
            ))
        })?;
        if pair.prompt.is_empty() {
            return Err(Failure::bad_input(format!(
                "{}: \"prompt\" is empty; the model needs at least one byte to start from",
                at()
            )));
        }
        if pair.completion.is_empty() {
            return Err(Failure::bad_input(format!(
                "{}: \"completion\" is empty; there would be nothing to train on or score",
                at()
            )));
        }
        examples.push(Example {
            prompt: pair.prompt.into_bytes(),
            completion: pair.completion.into_bytes(),
        });
    }
    if examples.is_empty() {
        return Err(Failure::bad_input(format!(
            "data file {} holds no prompt/completion lines",
            path.display()
        )));
    }
    Ok(examples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::FailureKind;

    #[test]
    fn jsonl_pairs_load_and_bad_lines_are_named() {
        let dir = crate::testutil::scratch_dir("jsonl");
        let good = dir.join("good.jsonl");
        std::fs::write(
            &good,
            "{\"prompt\":\"a\",\"completion\":\"b\",\"id\":1}\n\n{\"prompt\":\"c\",\"completion\":\"d\"}\n",
        )
        .unwrap();
        let Dataset::Pairs(pairs) = load_file(&good).unwrap() else {
            panic!("expected pairs")
        };
        assert_eq!(pairs.len(), 2);
        assert_eq!(pairs[1].completion, b"d");

        let bad = dir.join("bad.jsonl");
        std::fs::write(
            &bad,
            "{\"prompt\":\"a\",\"completion\":\"b\"}\n{\"prompt\":3}\n",
        )
        .unwrap();
        let err = load_file(&bad).unwrap_err();
        assert_eq!(err.kind, FailureKind::BadInput);
        assert!(err.message.contains("bad.jsonl:2:"), "{}", err.message);

        let missing = load_file(&dir.join("nope.txt")).unwrap_err();
        assert_eq!(missing.kind, FailureKind::BadInput);
        assert!(missing.message.contains("nope.txt"), "{}", missing.message);

        let text = dir.join("t.txt");
        std::fs::write(&text, "hello").unwrap();
        assert_eq!(load_file(&text).unwrap(), Dataset::Text(b"hello".to_vec()));
    }
}
