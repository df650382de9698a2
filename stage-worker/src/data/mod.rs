//! Training and evaluation data: where it comes from ([`load`]) and how it becomes batches
//! ([`batch`]).
//!
//! A `data` parameter is one of:
//! - `synthetic:pretrain`: generated English-like text (see [`synthetic`]);
//! - `synthetic:sft`: generated instruction pairs (`upper: cat dog\n` → `CAT DOG\n`);
//! - a path (relative to the working directory): `*.jsonl` holds one
//!   `{"prompt": …, "completion": …}` object per line, anything else is plain text (bytes).

pub mod batch;
pub mod files;
pub mod rng;
pub mod synthetic;

use crate::failure::{Failure, StageResult};
use std::path::Path;

/// One prompt/completion pair, as bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// What the model is given.
    pub prompt: Vec<u8>,
    /// What it should produce; the only part trained on and scored.
    pub completion: Vec<u8>,
}

/// A loaded data set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dataset {
    /// A byte stream; trained on as random windows.
    Text(Vec<u8>),
    /// Prompt/completion pairs; trained on the completion only.
    Pairs(Vec<Example>),
}

/// Which part of a synthetic task to generate. Synthetic pairs are split by a hash of the
/// prompt, so held-out examples never occur in training whatever the seeds; user files are used
/// as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The training part.
    Train,
    /// The held-out part, for evaluation.
    HeldOut,
}

/// The prefix that names a built-in synthetic data set.
pub const SYNTHETIC_PREFIX: &str = "synthetic:";

/// Loads the data set named by a `data` parameter. `seed` drives synthetic generation; `want`
/// is how many held-out examples (or text windows) an evaluation will draw.
pub fn load(data: &str, seed: u64, split: Split, want: usize) -> StageResult<Dataset> {
    if let Some(name) = data.strip_prefix(SYNTHETIC_PREFIX) {
        return match name {
            "pretrain" => Ok(Dataset::Text(synthetic::pretrain_text(
                seed,
                synthetic::corpus_bytes(split, want),
            ))),
            "sft" => Ok(Dataset::Pairs(synthetic::sft_examples(
                seed,
                synthetic::example_count(split, want),
                split,
            ))),
            other => Err(Failure::bad_input(format!(
                "unknown synthetic data set `synthetic:{other}`: use `synthetic:pretrain` or `synthetic:sft`"
            ))),
        };
    }
    if data.trim().is_empty() {
        return Err(Failure::bad_input(
            "params.data is empty: name `synthetic:pretrain`, `synthetic:sft` or a file",
        ));
    }
    files::load_file(Path::new(data))
}

impl Dataset {
    /// A short description for logs: "text, 1048576 bytes" or "pairs, 20000 examples".
    pub fn describe(&self) -> String {
        match self {
            Dataset::Text(t) => format!("text, {} bytes", t.len()),
            Dataset::Pairs(p) => format!("prompt/completion pairs, {} examples", p.len()),
        }
    }
}
