//! Built-in deterministic data sets, so a pipeline runs with nothing to download.
//!
//! - Pretraining text: short sentences over a small lowercase vocabulary ("the big cat sees a
//!   red fox."), one per line; some lines are followed by the same sentence in capitals, so
//!   the corpus holds both spellings of every word and the habit of repeating a line.
//! - The SFT task, upper-casing: the prompt `upper: cat red sees\n` asks for the completion
//!   `CAT RED SEES\n` (one to four words from the same vocabulary). A pretrained model has
//!   never seen the `upper:` instruction, so it does not follow it; a few hundred fine-tuning
//!   steps teach it.
//!
//! Everything here is a pure function of its seed.

use super::{Example, Split};
use crate::data::rng::{stable_hash, Rng};

const NOUNS: &[&str] = &[
    "cat", "dog", "bird", "fish", "fox", "owl", "cow", "bee", "frog", "duck", "goat", "hen",
    "lion", "bear", "wolf", "deer", "mouse", "horse", "sheep", "crab",
];
const ADJECTIVES: &[&str] = &[
    "red", "blue", "green", "big", "small", "old", "young", "happy", "sad", "fast", "slow", "tall",
];
const VERBS: &[&str] = &[
    "sees", "likes", "finds", "chases", "helps", "meets", "follows", "hears", "feeds", "calls",
];

/// The prompt prefix of the SFT task.
pub const SFT_INSTRUCTION: &str = "upper: ";

/// One in this many synthetic prompts (by hash) belongs to the held-out split.
const HELD_OUT_ONE_IN: u64 = 8;

/// Size of a generated pretraining corpus for `split`, in bytes: 1 MiB for training, and for
/// evaluation enough for `want` windows of a few hundred bytes (at least 64 KiB).
pub fn corpus_bytes(split: Split, want: usize) -> usize {
    match split {
        Split::Train => 1 << 20,
        Split::HeldOut => (want * 512).max(64 << 10),
    }
}

/// How many SFT examples to generate for `split`: 20 000 for training, `want` for evaluation.
pub fn example_count(split: Split, want: usize) -> usize {
    match split {
        Split::Train => 20_000,
        Split::HeldOut => want.max(1),
    }
}

fn sentence(rng: &mut Rng) -> String {
    let noun = |rng: &mut Rng| *rng.pick(NOUNS);
    let adj = |rng: &mut Rng| *rng.pick(ADJECTIVES);
    let verb = |rng: &mut Rng| *rng.pick(VERBS);
    let det = |rng: &mut Rng| if rng.below(2) == 0 { "the" } else { "a" };
    match rng.below(4) {
        0 => format!(
            "{} {} {} {} {} {}.",
            det(rng),
            adj(rng),
            noun(rng),
            verb(rng),
            det(rng),
            noun(rng)
        ),
        1 => format!(
            "{} {} {} {} {}.",
            det(rng),
            noun(rng),
            verb(rng),
            det(rng),
            noun(rng)
        ),
        2 => format!("{} {} is {}.", det(rng), noun(rng), adj(rng)),
        _ => format!(
            "{} {} and {} {} {} {}.",
            det(rng),
            noun(rng),
            det(rng),
            noun(rng),
            verb(rng).trim_end_matches('s'),
            noun(rng)
        ),
    }
}

/// Generated pretraining text of exactly `bytes` bytes (cut at the end), a function of `seed`.
pub fn pretrain_text(seed: u64, bytes: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = String::with_capacity(bytes + 128);
    while out.len() < bytes {
        let s = sentence(&mut rng);
        out.push_str(&s);
        out.push('\n');
        if rng.unit() < 0.3 {
            out.push_str(&s.to_ascii_uppercase());
            out.push('\n');
        }
    }
    let mut text = out.into_bytes();
    text.truncate(bytes);
    text
}

/// Whether a synthetic prompt belongs to the held-out split.
pub fn is_held_out(prompt: &[u8]) -> bool {
    stable_hash(prompt) % HELD_OUT_ONE_IN == 0
}

/// One SFT example drawn from `rng` (either split).
fn sft_example(rng: &mut Rng) -> Example {
    let n = 1 + rng.below(4);
    let words: Vec<&str> = (0..n)
        .map(|_| match rng.below(3) {
            0 => *rng.pick(NOUNS),
            1 => *rng.pick(ADJECTIVES),
            _ => *rng.pick(VERBS),
        })
        .collect();
    let line = words.join(" ");
    Example {
        prompt: format!("{SFT_INSTRUCTION}{line}\n").into_bytes(),
        completion: format!("{}\n", line.to_ascii_uppercase()).into_bytes(),
    }
}

/// `count` SFT examples of `split`, a function of `seed`.
pub fn sft_examples(seed: u64, count: usize, split: Split) -> Vec<Example> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let ex = sft_example(&mut rng);
        if is_held_out(&ex.prompt) == (split == Split::HeldOut) {
            out.push(ex);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretrain_text_is_deterministic_for_a_seed() {
        let a = pretrain_text(5, 10_000);
        let b = pretrain_text(5, 10_000);
        let c = pretrain_text(6, 10_000);
        assert_eq!(a.len(), 10_000);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let text = String::from_utf8(a).unwrap();
        assert!(text.contains("the "), "{}", &text[..200]);
        assert!(text
            .lines()
            .any(|l| l.chars().any(|c| c.is_ascii_uppercase())));
    }

    #[test]
    fn sft_examples_are_deterministic_and_well_formed() {
        let a = sft_examples(3, 50, Split::Train);
        assert_eq!(a, sft_examples(3, 50, Split::Train));
        assert_ne!(a, sft_examples(4, 50, Split::Train));
        for ex in &a {
            let prompt = std::str::from_utf8(&ex.prompt).unwrap();
            let words = prompt.strip_prefix(SFT_INSTRUCTION).unwrap();
            assert_eq!(
                words.to_ascii_uppercase().as_bytes(),
                ex.completion.as_slice()
            );
        }
    }

    #[test]
    fn held_out_examples_never_occur_in_training() {
        let train = sft_examples(1, 5_000, Split::Train);
        let held = sft_examples(1_000_003, 200, Split::HeldOut);
        assert_eq!(held.len(), 200);
        for ex in &held {
            assert!(is_held_out(&ex.prompt));
            assert!(!train.iter().any(|t| t.prompt == ex.prompt));
        }
    }
}
