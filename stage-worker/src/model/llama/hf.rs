//! Llama models in Hugging Face's directory format: `config.json`, the weights in
//! `model.safetensors` (or the shards a `model.safetensors.index.json` lists) under
//! transformers' names, and the tokenizer's files beside them.

use super::config::LlamaConfig;
use super::Llama;
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
    tensors.retain(|(name, _)| {
        !(name.ends_with("rotary_emb.inv_freq")
            || (config.tie_word_embeddings && name == "lm_head.weight"))
    });
    let model = Llama::zeroed(&config, device);
    model
        .params
        .load(&tensors, &format!("the model in {}", dir.display()))?;
    Ok(model)
}

/// `tensors` as a safetensors file with transformers' metadata (`format = pt`), in order.
pub fn safetensors_bytes(tensors: &[(String, Tensor)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut at = 0usize;
    let mut data = Vec::new();
    for (name, t) in tensors {
        let t = t.to_device(Device::Cpu).contiguous();
        let dtype = match t.kind() {
            Kind::Float => "F32",
            Kind::BFloat16 => "BF16",
            Kind::Half => "F16",
            Kind::Int64 => "I64",
            other => panic!("no safetensors dtype for {other:?}"),
        };
        let bytes = t.numel() * t.kind().elt_size_in_bytes();
        let start = data.len();
        data.resize(start + bytes, 0);
        t.copy_data_u8(&mut data[start..], t.numel());
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": t.size(), "data_offsets": [at, at + bytes]}),
        );
        at += bytes;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(header)).expect("serializes");
    while (8 + json.len()) % 8 != 0 {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len() + data.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&data);
    out
}

/// The files of `model` as a Hugging Face directory, weights in fp32: `model.safetensors`
/// (transformers' names), `config.json`, and each of [`COMPANION_FILES`] found in `from` (the
/// directory the model came from), copied as they are.
pub fn files(model: &Llama, from: &Path) -> Result<Vec<(&'static str, Vec<u8>)>, String> {
    let tensors: Vec<(String, Tensor)> = tch::no_grad(|| {
        model
            .params
            .params
            .iter()
            .map(|p| (p.name.clone(), p.tensor.detach()))
            .collect()
    });
    let mut out = vec![(WEIGHTS_FILE, safetensors_bytes(&tensors))];
    let mut config =
        serde_json::to_vec_pretty(&model.config.to_json("float32")).expect("config serializes");
    config.push(b'\n');
    out.push((CONFIG_FILE, config));
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
