//! Llama models in Hugging Face's directory format: `config.json`, the weights in
//! `model.safetensors` (or the shards a `model.safetensors.index.json` lists) under
//! transformers' names, and the tokenizer's files beside them. The model reads from and
//! writes to this format under its own parameters' names ([`crate::model::llama`]).

use crate::checkpoint::stream::{header, HeaderEntry};
use crate::model::llama::config::LlamaConfig;
use crate::model::llama::Llama;
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// The weights' file in a directory this worker writes.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The model's shape.
pub const CONFIG_FILE: &str = "config.json";
/// The index of a sharded checkpoint.
const INDEX_FILE: &str = "model.safetensors.index.json";
/// Files of the tokenizer and generation settings copied from a model's directory to the next.
pub const COMPANION_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
    "chat_template.jinja",
];

/// Whether `dir` holds a Hugging Face model (a `config.json`).
pub fn is_hf_dir(dir: &Path) -> bool {
    dir.join(CONFIG_FILE).is_file()
}

/// Reads `dir`'s `config.json`.
pub fn read_config(dir: &Path) -> Result<LlamaConfig, String> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    LlamaConfig::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The weight files of `dir`: `model.safetensors`, else the shards its index names.
fn weight_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    if dir.join(WEIGHTS_FILE).is_file() {
        return Ok(vec![dir.join(WEIGHTS_FILE)]);
    }
    let index = dir.join(INDEX_FILE);
    let text = std::fs::read_to_string(&index).map_err(|_| {
        format!(
            "{} has neither {WEIGHTS_FILE} nor {INDEX_FILE}",
            dir.display()
        )
    })?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", index.display()))?;
    let map = value["weight_map"]
        .as_object()
        .ok_or_else(|| format!("{} has no weight_map", index.display()))?;
    let mut files: Vec<String> = map
        .values()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    files.sort();
    files.dedup();
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
}

/// The model in `dir` on `device` (fp32 parameters, whatever dtype the files hold). Every
/// tensor the model needs must be there with its shape; a tied model's `lm_head.weight`, if
/// stored, is ignored, as transformers does.
pub fn load(dir: &Path, device: Device) -> Result<Llama, String> {
    let config = read_config(dir)?;
    let mut tensors = Vec::new();
    for file in weight_files(dir)? {
        let bytes =
            std::fs::read(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let what = file.display().to_string();
        tensors.extend(crate::checkpoint::decode_tensors(&bytes, &what)?);
    }
    from_tensors(
        &config,
        tensors,
        device,
        &format!("the model in {}", dir.display()),
    )
}

/// The model shaped `config` on `device` (fp32 parameters) with the weights `tensors`, under
/// transformers' names, as [`load`] takes them; `what` names their source in errors.
pub fn from_tensors(
    config: &LlamaConfig,
    mut tensors: Vec<(String, Tensor)>,
    device: Device,
    what: &str,
) -> Result<Llama, String> {
    tensors.retain(|(name, _)| {
        !(name.ends_with("rotary_emb.inv_freq")
            || (config.tie_word_embeddings && name == "lm_head.weight"))
    });
    let model = Llama::zeroed(config, device);
    model.params.load(&tensors, what)?;
    Ok(model)
}

/// The header metadata transformers writes, and checks when it loads a file: `format = pt`.
pub fn metadata() -> serde_json::Value {
    serde_json::json!({"format": "pt"})
}

/// `tensors` as a safetensors file with transformers' [`metadata`], in order.
pub fn safetensors_bytes(tensors: &[(String, Tensor)]) -> Vec<u8> {
    let tensors: Vec<(&String, Tensor)> = tensors
        .iter()
        .map(|(name, t)| (name, t.to_device(Device::Cpu).contiguous()))
        .collect();
    let entries: Vec<HeaderEntry> = tensors
        .iter()
        .map(|(name, t)| HeaderEntry {
            name: name.to_string(),
            dtype: match t.kind() {
                Kind::Float => "F32",
                Kind::BFloat16 => "BF16",
                Kind::Half => "F16",
                Kind::Int64 => "I64",
                other => panic!("no safetensors dtype for {other:?}"),
            },
            shape: t.size(),
            bytes: t.numel() * t.kind().elt_size_in_bytes(),
        })
        .collect();
    let mut out = header(&entries, Some(&metadata()));
    for ((_, t), e) in tensors.iter().zip(&entries) {
        let start = out.len();
        out.resize(start + e.bytes, 0);
        t.copy_data_u8(&mut out[start..], t.numel());
    }
    out
}

/// The small files of `model`'s Hugging Face directory (the weights aside, which
/// [`crate::checkpoint::tensor_files`] streams under transformers' names as they are the
/// model's own): `config.json` (`dtype = float32`), and each of [`COMPANION_FILES`] found in
/// `from` (the directory the model came from), copied as they are.
pub fn companion_files(model: &Llama, from: &Path) -> Result<Vec<(&'static str, Vec<u8>)>, String> {
    let mut config =
        serde_json::to_vec_pretty(&model.config.to_json("float32")).expect("config serializes");
    config.push(b'\n');
    let mut out = vec![(CONFIG_FILE, config)];
    for name in COMPANION_FILES {
        let path = from.join(name);
        if path.is_file() {
            let bytes =
                std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            out.push((*name, bytes));
        }
    }
    Ok(out)
}
