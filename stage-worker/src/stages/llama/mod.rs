//! Built-in stages on Llama-architecture models in Hugging Face's format.
//!
//! A stage is a Llama stage when its `init` directory (a path, or an upstream stage's output)
//! holds a `config.json`: a Hugging Face model, such as one `save_pretrained` wrote or one a
//! Llama `train` stage left. `params.model` is then ignored; the other `train` and `eval`
//! parameters mean what they mean for the byte-level model, except `data`, which names a
//! local file tokenized with the directory's `tokenizer.json` ([`data`]).
//!
//! A `train` stage's output directory is a Hugging Face model again: `model.safetensors` (fp32,
//! transformers' names), `config.json`, the tokenizer's files copied from `init`, plus
//! `optimizer.safetensors` and `manifest.json` for resuming and for the orchestrator, written
//! as the byte-level model's checkpoints are (streamed, the manifest last, the device given
//! back as soon as the data is on the host: a downstream stage may start early).

pub mod data;
pub mod eval;
pub mod train;

use crate::checkpoint::hf;
use crate::checkpoint::{self, Verified};
use crate::failure::{Failure, StageResult};
use crate::model::llama::config::LlamaConfig;
use crate::model::llama::Llama;
use protocol::worker::StageSpec;
use std::path::{Path, PathBuf};

/// The model in the verified checkpoint `v` (its `model.safetensors`), on `device`.
fn load_verified(v: &Verified, device: tch::Device) -> StageResult<Llama> {
    let config = hf::read_config(&v.dir).map_err(Failure::bad_input)?;
    let what = v.dir.join(checkpoint::MODEL_FILE).display().to_string();
    let tensors = v.tensors(checkpoint::MODEL_FILE)?;
    hf::from_tensors(&config, tensors, device, &what).map_err(Failure::bad_input)
}

/// The Llama model in `dir` on `device`, and the step its manifest records: from a checkpoint
/// a stage wrote (it has a manifest listing `model.safetensors`), the weights checked against
/// the manifest (size and checksum) before use, a mismatch a bad-input failure; from a
/// directory `save_pretrained` wrote, read as it is.
pub fn load_checked(dir: &Path, device: tch::Device) -> StageResult<(Llama, Option<u64>)> {
    let listed = |v: &Verified| {
        v.manifest
            .files
            .iter()
            .any(|f| f.path == checkpoint::MODEL_FILE)
    };
    if checkpoint::exists(dir) {
        let v = checkpoint::open_for_weights(dir)?;
        if listed(&v) {
            let model = load_verified(&v, device)?;
            v.finish()?;
            return Ok((model, v.manifest.step));
        }
    }
    let model = hf::load(dir, device).map_err(Failure::bad_input)?;
    Ok((model, None))
}

/// The Hugging Face model directory `spec`'s `init` names, if it is one. An input still being
/// written (an early start) is one too: a Llama `train` stage puts its `config.json` in place
/// before it copies any weight off its device, and so before it releases the device (see
/// [`train`]); the stage then waits for its manifest before reading the weights.
pub fn hf_init(spec: &StageSpec) -> Option<PathBuf> {
    let dir = spec.init.as_deref()?;
    hf::is_hf_dir(dir).then(|| dir.to_path_buf())
}

/// The attention work of one step of the model that [`CUDNN_FROM_STEPS`] was measured on (the
/// throughput benchmark's 100M model: 8 layers, 16 heads of 64, batch 32 × 256), as
/// layers × heads × head size × batch × sequence².
///
/// [`CUDNN_FROM_STEPS`]: crate::model::attention::CUDNN_FROM_STEPS
const REFERENCE_ATTENTION_WORK: f64 = 8.0 * 16.0 * 64.0 * 32.0 * 256.0 * 256.0;

/// How many steps of the reference model's attention (see [`REFERENCE_ATTENTION_WORK`]) a
/// stage of `steps` steps of `batch` × `seq` tokens on model `c` amounts to: what cuDNN's
/// attention saves per step grows with that work, while its first use costs the same.
pub fn attention_steps(c: &LlamaConfig, steps: u64, batch: u32, seq: u32) -> u64 {
    let work = (c.num_hidden_layers * c.num_attention_heads * c.head_dim) as f64
        * f64::from(batch)
        * f64::from(seq).powi(2);
    (steps as f64 * work / REFERENCE_ATTENTION_WORK).ceil() as u64
}

/// Applies the attention kernels for a stage of `steps` planned steps of `batch` × `seq`
/// tokens on CUDA, on model `c`: `auto` counts the steps as [`attention_steps`] (a 1B Llama's
/// step is several of the reference model's), and where it would then choose PyTorch's
/// memory-efficient kernels for a model with grouped-query attention, which they do not take
/// (libtorch would fall back to the plain math ones), it chooses flash attention (which takes
/// it, and starts as fast) instead.
pub fn choose_attention(c: &LlamaConfig, steps: u64, batch: u32, seq: u32) {
    use crate::model::attention::{self, Kernels};
    let asked = Kernels::from_env().unwrap_or(Kernels::Auto);
    let gqa = c.num_key_value_heads != c.num_attention_heads;
    let kernels = match asked.for_steps(attention_steps(c, steps, batch, seq)) {
        Kernels::Efficient if gqa && asked == Kernels::Auto => Kernels::Flash,
        chosen => chosen,
    };
    attention::apply(kernels);
}

/// `stage-worker llama-logits`: writes the fp32 CPU logits of the model in `model` for `ids`
/// (rows separated by `;`, ids by `,`) to `out` as a safetensors file holding `logits`.
pub fn write_logits(model: &std::path::Path, ids: &str, out: &std::path::Path) -> StageResult<()> {
    let bad = crate::failure::Failure::bad_input;
    let rows: Result<Vec<Vec<i64>>, _> = ids
        .split(';')
        .map(|r| r.split(',').map(|x| x.trim().parse::<i64>()).collect())
        .collect();
    let rows = rows.map_err(|e| bad(format!("--ids: {e}")))?;
    let logits = eval::logits(model, &rows).map_err(bad)?;
    let bytes = hf::safetensors_bytes(&[("logits".to_string(), logits)]);
    std::fs::write(out, bytes)
        .map_err(|e| crate::failure::Failure::other(format!("cannot write {}: {e}", out.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::CUDNN_FROM_STEPS;

    fn config(layers: i64, heads: i64, head_dim: i64) -> LlamaConfig {
        LlamaConfig::parse(&format!(
            r#"{{"model_type":"llama","vocab_size":100,"hidden_size":{},"intermediate_size":64,
            "num_hidden_layers":{layers},"num_attention_heads":{heads},"num_key_value_heads":1,
            "max_position_embeddings":512}}"#,
            heads * head_dim
        ))
        .unwrap()
    }

    /// The reference shape counts step for step; TinyLlama's 1.1B shape (22 layers, 32 heads
    /// of 64) at the same batch counts 5.5 steps a step, so 100 steps reach cuDNN's threshold;
    /// a tiny model's do not.
    #[test]
    fn a_larger_model_reaches_the_cudnn_threshold_in_fewer_steps() {
        assert_eq!(attention_steps(&config(8, 16, 64), 200, 32, 256), 200);
        assert_eq!(attention_steps(&config(22, 32, 64), 100, 32, 256), 550);
        assert!(attention_steps(&config(22, 32, 64), 100, 32, 256) >= CUDNN_FROM_STEPS);
        assert!(attention_steps(&config(2, 4, 16), 1000, 8, 64) < CUDNN_FROM_STEPS);
    }
}
