//! A Llama stage's data: a local file tokenized with the model's `tokenizer.json`, and its
//! batches.
//!
//! A `.jsonl` file holds one object per line, either `{"text": …}` (pretraining: the documents
//! are tokenized, each followed by the end-of-sequence token, concatenated and trained on as
//! random windows) or `{"prompt": …, "completion": …}` (SFT: one row per example, the loss on
//! the completion and its end-of-sequence token only). Any other file is one text document.

use crate::data::batch::{HostBatch, IGNORE};
use crate::data::rng::Rng;
use crate::failure::{Failure, StageResult};
use std::path::Path;
use tokenizers::Tokenizer;

/// Token ids to train or evaluate on.
pub enum TokenData {
    /// One stream of every document's tokens.
    Text(Vec<i64>),
    /// (prompt, completion) token ids per example.
    Pairs(Vec<(Vec<i64>, Vec<i64>)>),
}

/// The tokenizer a model directory holds and its end-of-sequence id (from `config.json`'s
/// `eos_token_id`, the first of a list).
pub struct Tokens {
    tokenizer: Tokenizer,
    eos: Option<i64>,
}

impl Tokens {
    /// Reads `dir/tokenizer.json`; `eos` from the model's config.
    pub fn open(
        dir: &Path,
        config: &serde_json::Map<String, serde_json::Value>,
    ) -> StageResult<Tokens> {
        let path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| {
            Failure::bad_input(format!("cannot read the tokenizer {}: {e}", path.display()))
        })?;
        let eos = match config.get("eos_token_id") {
            Some(serde_json::Value::Array(ids)) => ids.first().and_then(serde_json::Value::as_i64),
            Some(v) => v.as_i64(),
            None => None,
        };
        Ok(Tokens { tokenizer, eos })
    }

    /// The ids of `text`, with the tokenizer's special tokens (a BOS) when `special`.
    pub fn encode(&self, text: &str, special: bool) -> StageResult<Vec<i64>> {
        let enc = self
            .tokenizer
            .encode(text, special)
            .map_err(|e| Failure::bad_input(format!("the tokenizer failed: {e}")))?;
        Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
    }

    fn with_eos(&self, mut ids: Vec<i64>) -> Vec<i64> {
        ids.extend(self.eos);
        ids
    }
}

/// Reads and tokenizes `data` (a path relative to the working directory).
pub fn load(data: &str, tokens: &Tokens) -> StageResult<TokenData> {
    let bad = |m: String| Failure::bad_input(format!("params.data `{data}`: {m}"));
    if data.starts_with(crate::data::SYNTHETIC_PREFIX) {
        return Err(bad(
            "a Llama model trains on a file (.jsonl of {\"text\"} or {\"prompt\", \"completion\"} lines, or plain text), not on the byte-level synthetic sets".into(),
        ));
    }
    let text = std::fs::read_to_string(data).map_err(|e| bad(format!("cannot read it: {e}")))?;
    if !data.ends_with(".jsonl") {
        return Ok(TokenData::Text(
            tokens.with_eos(tokens.encode(&text, true)?),
        ));
    }
    let (mut stream, mut pairs) = (Vec::new(), Vec::new());
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| bad(format!("line {}: not JSON: {e}", n + 1)))?;
        let field = |k: &str| v.get(k).and_then(serde_json::Value::as_str);
        match (field("text"), field("prompt"), field("completion")) {
            (Some(t), None, None) => stream.extend(tokens.with_eos(tokens.encode(t, true)?)),
            (None, Some(p), Some(c)) => {
                pairs.push((tokens.encode(p, true)?, tokens.with_eos(tokens.encode(c, false)?)))
            }
            _ => {
                return Err(bad(format!(
                    "line {}: expected {{\"text\": …}} or {{\"prompt\": …, \"completion\": …}} with string values",
                    n + 1
                )))
            }
        }
    }
    match (stream.is_empty(), pairs.is_empty()) {
        (false, true) => Ok(TokenData::Text(stream)),
        (true, false) => Ok(TokenData::Pairs(pairs)),
        (true, true) => Err(bad("it holds no examples".into())),
        (false, false) => Err(bad("it mixes text lines and prompt/completion lines".into())),
    }
}

/// One row of a prompt/completion example, `seq_len` wide: inputs, and targets that score the
/// completion only (the prompt and the padding are [`IGNORE`]); a completion that does not
/// fit is cut. `None` when the prompt alone leaves no completion token in the row.
pub fn pair_row(
    prompt: &[i64],
    completion: &[i64],
    seq_len: usize,
) -> Option<(Vec<i64>, Vec<i64>)> {
    if prompt.is_empty() || prompt.len() > seq_len || completion.is_empty() {
        return None;
    }
    let all: Vec<i64> = prompt
        .iter()
        .chain(completion)
        .copied()
        .take(seq_len + 1)
        .collect();
    let mut inputs = all[..all.len() - 1].to_vec();
    let mut targets: Vec<i64> = all[1..]
        .iter()
        .enumerate()
        .map(|(j, &t)| if j + 1 < prompt.len() { IGNORE } else { t })
        .collect();
    inputs.resize(seq_len, 0);
    targets.resize(seq_len, IGNORE);
    Some((inputs, targets))
}

impl TokenData {
    /// For logs: "text, 12345 tokens" or "prompt/completion pairs, 100 examples".
    pub fn describe(&self) -> String {
        match self {
            TokenData::Text(t) => format!("text, {} tokens", t.len()),
            TokenData::Pairs(p) => format!("prompt/completion pairs, {} examples", p.len()),
        }
    }

    /// Checks that batches of `seq_len` can be drawn; the message says why not.
    pub fn check(&self, seq_len: usize) -> Result<(), String> {
        match self {
            TokenData::Text(t) if t.len() <= seq_len => Err(format!(
                "{} tokens is too short for seq_len {seq_len}",
                t.len()
            )),
            TokenData::Pairs(p) if !p.iter().any(|(a, b)| pair_row(a, b, seq_len).is_some()) => {
                Err(format!("no example's prompt fits in seq_len {seq_len}"))
            }
            _ => Ok(()),
        }
    }

    /// Training batch `step`: `rows` random windows or examples, a function of `seed` and
    /// `step` only (a resumed training draws the same batches). [`TokenData::check`] first.
    pub fn batch(&self, seed: u64, step: u64, rows: usize, seq_len: usize) -> HostBatch {
        let mut rng = Rng::for_stream(seed, step);
        let mut b = HostBatch {
            inputs: Vec::with_capacity(rows * seq_len),
            targets: Vec::with_capacity(rows * seq_len),
            rows,
            cols: seq_len,
        };
        for _ in 0..rows {
            let (inputs, targets) = match self {
                TokenData::Text(t) => {
                    let s = rng.below(t.len() - seq_len);
                    (
                        t[s..s + seq_len].to_vec(),
                        t[s + 1..s + seq_len + 1].to_vec(),
                    )
                }
                TokenData::Pairs(p) => loop {
                    let (a, c) = rng.pick(p);
                    if let Some(row) = pair_row(a, c, seq_len) {
                        break row;
                    }
                },
            };
            b.inputs.extend(inputs);
            b.targets.extend(targets);
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_row_scores_the_completion_only() {
        let (inputs, targets) = pair_row(&[1, 10, 11], &[20, 21, 2], 8).unwrap();
        assert_eq!(inputs, [1, 10, 11, 20, 21, 0, 0, 0]);
        assert_eq!(targets, [IGNORE, IGNORE, 20, 21, 2, IGNORE, IGNORE, IGNORE]);
        let (inputs, targets) = pair_row(&[1, 10, 11], &[20, 21, 2], 4).unwrap();
        assert_eq!(inputs, [1, 10, 11, 20]);
        assert_eq!(targets, [IGNORE, IGNORE, 20, 21]);
        assert!(pair_row(&[1, 2, 3, 4, 5], &[6], 4).is_none());
    }
}
