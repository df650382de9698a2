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
//! `optimizer.safetensors` and `manifest.json` for resuming and for the orchestrator.

pub mod data;
pub mod eval;
pub mod train;

use crate::failure::StageResult;
use crate::model::llama::hf;
use protocol::worker::StageSpec;
use std::path::PathBuf;

/// The Hugging Face model directory `spec`'s `init` names, if it is one. An input still being
/// written (an early start) is not looked at here: only byte-level stages release early.
pub fn hf_init(spec: &StageSpec) -> Option<PathBuf> {
    let dir = spec.init.as_deref()?;
    if crate::checkpoint::input_wait::pending(spec, dir) {
        return None;
    }
    hf::is_hf_dir(dir).then(|| dir.to_path_buf())
}

/// Applies the attention kernels for a stage of `steps` planned steps on CUDA, of a model
/// with grouped-query attention (`gqa`: fewer key/value heads than query heads) or not.
/// PyTorch's memory-efficient kernels do not take grouped-query attention (libtorch would fall
/// back to the plain math ones), so where `auto` would choose them for such a model it
/// chooses flash attention (which takes it, and starts as fast) instead.
pub fn choose_attention(steps: u64, gqa: bool) {
    use crate::model::attention::{self, Kernels};
    let asked = Kernels::from_env().unwrap_or(Kernels::Auto);
    let kernels = match asked.for_steps(steps) {
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
