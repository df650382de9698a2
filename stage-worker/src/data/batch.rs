//! Batches: token ids and next-token targets, built on the host and moved to the device.

use super::{Dataset, Example};
use crate::data::rng::Rng;
use tch::{Device, Kind, Tensor};

/// Target value that the loss ignores (prompt positions and padding).
pub const IGNORE: i64 = -100;
/// Input byte used to pad short rows (never scored).
pub const PAD: i64 = 0;

/// A batch on the host: `rows` × `cols` inputs and targets, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBatch {
    /// Input byte ids.
    pub inputs: Vec<i64>,
    /// The byte each position should predict, or [`IGNORE`].
    pub targets: Vec<i64>,
    /// Sequences.
    pub rows: usize,
    /// Positions per sequence.
    pub cols: usize,
}

/// A batch on the compute device.
pub struct Batch {
    /// `[rows, cols]` int64 input ids.
    pub inputs: Tensor,
    /// `[rows, cols]` int64 targets, [`IGNORE`] where not scored.
    pub targets: Tensor,
    /// Input positions processed (rows × cols), for throughput.
    pub tokens: usize,
}

impl HostBatch {
    /// Copies the batch to `device`. On CUDA the copy is asynchronous (the few KiB of a batch
    /// are staged by the driver and the call does not wait for the device), so building a
    /// batch never stalls the GPU's queue.
    pub fn to_device(&self, device: Device) -> Batch {
        let shape = [self.rows as i64, self.cols as i64];
        let upload = |v: &[i64]| {
            let t = Tensor::from_slice(v).view(shape);
            if device.is_cuda() {
                // Not through `pin_memory`: tch passes it a device, which libtorch 2.11
                // answers with a deprecation warning on every call.
                t.to_device_(device, Kind::Int64, true, false)
            } else {
                t
            }
        };
        Batch {
            inputs: upload(&self.inputs),
            targets: upload(&self.targets),
            tokens: self.rows * self.cols,
        }
    }

    /// Positions whose target is scored.
    pub fn scored(&self) -> usize {
        self.targets.iter().filter(|&&t| t != IGNORE).count()
    }
}

/// Windows of `seq_len + 1` bytes of `text` starting at `starts`: inputs are the first
/// `seq_len` bytes, targets the last `seq_len`.
pub fn text_windows(text: &[u8], starts: &[usize], seq_len: usize) -> HostBatch {
    let mut inputs = Vec::with_capacity(starts.len() * seq_len);
    let mut targets = Vec::with_capacity(starts.len() * seq_len);
    for &s in starts {
        let w = &text[s..s + seq_len + 1];
        inputs.extend(w[..seq_len].iter().map(|&b| i64::from(b)));
        targets.extend(w[1..].iter().map(|&b| i64::from(b)));
    }
    HostBatch {
        inputs,
        targets,
        rows: starts.len(),
        cols: seq_len,
    }
}

/// Whether an example leaves at least one completion byte to score within `seq_len` inputs.
pub fn fits(example: &Example, seq_len: usize) -> bool {
    !example.prompt.is_empty() && !example.completion.is_empty() && example.prompt.len() <= seq_len
}

/// Row widths of prompt/completion batches are rounded up to a multiple of this (at most
/// `seq_len`), so the device sees a handful of shapes rather than one per batch.
pub const WIDTH_STEP: usize = 8;

/// `width` rounded up to a multiple of [`WIDTH_STEP`], but not beyond `cap`.
pub fn round_width(width: usize, cap: usize) -> usize {
    width
        .div_ceil(WIDTH_STEP)
        .saturating_mul(WIDTH_STEP)
        .min(cap)
        .max(width)
}

/// Rows of prompt+completion, cut to `seq_len + 1` bytes, right-padded to the longest row
/// (rounded up with [`round_width`]). Only completion bytes are targets. Examples must satisfy
/// [`fits`].
pub fn pair_rows(examples: &[&Example], seq_len: usize) -> HostBatch {
    let lens: Vec<usize> = examples
        .iter()
        .map(|e| (e.prompt.len() + e.completion.len()).min(seq_len + 1))
        .collect();
    let longest = lens.iter().map(|l| l - 1).max().unwrap_or(1).max(1);
    let cols = round_width(longest, seq_len);
    let mut inputs = vec![PAD; examples.len() * cols];
    let mut targets = vec![IGNORE; examples.len() * cols];
    for (row, (ex, &len)) in examples.iter().zip(&lens).enumerate() {
        let seq: Vec<i64> = ex
            .prompt
            .iter()
            .chain(&ex.completion)
            .take(len)
            .map(|&b| i64::from(b))
            .collect();
        let base = row * cols;
        for i in 0..len - 1 {
            inputs[base + i] = seq[i];
            if i + 1 >= ex.prompt.len() {
                targets[base + i] = seq[i + 1];
            }
        }
    }
    HostBatch {
        inputs,
        targets,
        rows: examples.len(),
        cols,
    }
}

/// Draws training batches; batch `step` is a pure function of (seed, step), so a resumed run
/// sees the same batches it would have seen without the interruption.
pub struct Sampler<'a> {
    data: &'a Dataset,
    usable: Vec<&'a Example>,
    seed: u64,
    batch_size: usize,
    seq_len: usize,
}

impl<'a> Sampler<'a> {
    /// A sampler over `data`. Fails with a message for the user if `data` cannot fill one
    /// window: text shorter than `seq_len + 1` bytes, or no pair with a prompt shorter than
    /// `seq_len`.
    pub fn new(
        data: &'a Dataset,
        seed: u64,
        batch_size: usize,
        seq_len: usize,
    ) -> Result<Self, String> {
        let usable: Vec<&Example> = match data {
            Dataset::Text(text) => {
                if text.len() < seq_len + 1 {
                    return Err(format!(
                        "the text has {} bytes; seq_len {seq_len} needs at least {}",
                        text.len(),
                        seq_len + 1
                    ));
                }
                Vec::new()
            }
            Dataset::Pairs(pairs) => {
                let usable: Vec<&Example> = pairs.iter().filter(|e| fits(e, seq_len)).collect();
                if usable.is_empty() {
                    return Err(format!(
                        "no example has a prompt of at most seq_len = {seq_len} bytes, so nothing is left to train on"
                    ));
                }
                usable
            }
        };
        Ok(Sampler {
            data,
            usable,
            seed,
            batch_size,
            seq_len,
        })
    }

    /// Examples dropped because their prompt does not fit (pair data only).
    pub fn skipped(&self) -> usize {
        match self.data {
            Dataset::Pairs(p) => p.len() - self.usable.len(),
            Dataset::Text(_) => 0,
        }
    }

    /// The batch for optimizer step `step` (counting from 1).
    pub fn batch(&self, step: u64) -> HostBatch {
        let mut rng = Rng::for_stream(self.seed, step);
        match self.data {
            Dataset::Text(text) => {
                let span = text.len() - self.seq_len;
                let starts: Vec<usize> = (0..self.batch_size).map(|_| rng.below(span)).collect();
                text_windows(text, &starts, self.seq_len)
            }
            Dataset::Pairs(_) => {
                let picked: Vec<&Example> = (0..self.batch_size)
                    .map(|_| *rng.pick(&self.usable))
                    .collect();
                pair_rows(&picked, self.seq_len)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(p: &str, c: &str) -> Example {
        Example {
            prompt: p.as_bytes().to_vec(),
            completion: c.as_bytes().to_vec(),
        }
    }

    #[test]
    fn pair_rows_score_only_the_completion() {
        let a = ex("ab", "CD");
        let b = ex("x", "Y");
        let batch = pair_rows(&[&a, &b], 16);
        assert_eq!(batch.cols, 8);
        // Row a: inputs a b C, targets: (a→b ignored) b→C, C→D.
        assert_eq!(&batch.inputs[..3], &[97, 98, 67]);
        assert_eq!(&batch.targets[..3], &[IGNORE, 67, 68]);
        assert!(batch.targets[3..8].iter().all(|&t| t == IGNORE));
        // Row b: inputs x pad…, target x→Y.
        assert_eq!(&batch.inputs[8..11], &[120, PAD, PAD]);
        assert_eq!(&batch.targets[8..11], &[89, IGNORE, IGNORE]);
        assert_eq!(batch.scored(), 3);
        assert_eq!(round_width(3, 16), 8);
        assert_eq!(round_width(9, 12), 12);
        assert_eq!(round_width(13, 12), 13);
    }

    #[test]
    fn long_pairs_are_cut_to_the_window() {
        let a = ex("abc", "DEFGH");
        let batch = pair_rows(&[&a], 4);
        assert_eq!(batch.cols, 4);
        assert_eq!(batch.inputs, vec![97, 98, 99, 68]);
        assert_eq!(batch.targets, vec![IGNORE, IGNORE, 68, 69]);
        assert!(!fits(&ex("abcde", "F"), 4));
    }

    #[test]
    fn text_windows_shift_by_one() {
        let b = text_windows(b"hello world", &[0, 6], 4);
        assert_eq!(
            b.inputs,
            b"hell"
                .iter()
                .chain(b"worl")
                .map(|&x| i64::from(x))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            b.targets,
            b"ello"
                .iter()
                .chain(b"orld")
                .map(|&x| i64::from(x))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn sampler_batches_depend_only_on_seed_and_step() {
        let data = Dataset::Text(super::super::synthetic::pretrain_text(1, 5000));
        let s1 = Sampler::new(&data, 9, 4, 32).unwrap();
        let s2 = Sampler::new(&data, 9, 4, 32).unwrap();
        assert_eq!(s1.batch(5), s2.batch(5));
        assert_ne!(s1.batch(5), s1.batch(6));
        let short = Dataset::Text(b"tiny".to_vec());
        let err = Sampler::new(&short, 0, 4, 32).err().unwrap();
        assert!(err.contains("at least 33"), "{err}");
    }
}
