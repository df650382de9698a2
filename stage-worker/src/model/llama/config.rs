//! A Llama-architecture model's shape, read from a Hugging Face `config.json`.
//!
//! Both spellings transformers has used are read: `rope_theta` and `rope_scaling` at the top
//! level (transformers 4) and `rope_parameters` (transformers 5). What this worker cannot
//! compute the way transformers does (biases in attention or MLP, an activation other than
//! SiLU, a RoPE type other than `default` and `llama3`) is refused with a message naming the
//! field, never approximated.

use serde_json::{Map, Value};

/// The rotary embedding's frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: `1 / theta^(2i/d)`.
    Default,
    /// Llama 3's: low frequencies divided by `factor`, a smooth ramp between the two
    /// wavelength bounds.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

/// The shape and constants of a Llama model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: i64,
    /// Whether the LM head is the token embedding (no `lm_head.weight` of its own).
    pub tie_word_embeddings: bool,
    /// The whole `config.json`, written back with the output (token ids, generation settings
    /// and other fields this model does not use survive a stage).
    pub raw: Map<String, Value>,
}

fn int(obj: &Map<String, Value>, key: &str) -> Result<i64, String> {
    obj.get(key)
        .and_then(Value::as_i64)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("config.json: `{key}` must be a positive integer"))
}

fn float_or(obj: &Map<String, Value>, key: &str, default: f64) -> Result<f64, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_f64()
            .filter(|f| f.is_finite() && *f > 0.0)
            .ok_or_else(|| format!("config.json: `{key}` must be a positive number")),
    }
}

impl LlamaConfig {
    /// Parses a `config.json`'s text; the error names the field at fault.
    pub fn parse(text: &str) -> Result<LlamaConfig, String> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("config.json is not JSON: {e}"))?;
        let Value::Object(obj) = value else {
            return Err("config.json is not a JSON object".into());
        };
        match obj.get("model_type").and_then(Value::as_str) {
            Some("llama") => {}
            other => {
                return Err(format!(
                    "config.json: model_type is {other:?}; stage-worker trains \"llama\" models"
                ))
            }
        }
        for key in ["attention_bias", "mlp_bias"] {
            if obj.get(key).and_then(Value::as_bool) == Some(true) {
                return Err(format!("config.json: `{key}` = true is not supported"));
            }
        }
        if let Some(act) = obj.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                return Err(format!(
                    "config.json: hidden_act {act:?} is not supported (only \"silu\")"
                ));
            }
        }
        let hidden_size = int(&obj, "hidden_size")?;
        let num_attention_heads = int(&obj, "num_attention_heads")?;
        let num_key_value_heads = match obj.get("num_key_value_heads") {
            None | Some(Value::Null) => num_attention_heads,
            Some(_) => int(&obj, "num_key_value_heads")?,
        };
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(format!(
                "config.json: num_key_value_heads ({num_key_value_heads}) must divide num_attention_heads ({num_attention_heads})"
            ));
        }
        let head_dim = match obj.get("head_dim") {
            None | Some(Value::Null) => {
                if hidden_size % num_attention_heads != 0 {
                    return Err("config.json: num_attention_heads must divide hidden_size".into());
                }
                hidden_size / num_attention_heads
            }
            Some(_) => int(&obj, "head_dim")?,
        };
        if head_dim % 2 != 0 {
            return Err(format!("config.json: head_dim ({head_dim}) must be even"));
        }
        let rope = obj.get("rope_parameters").and_then(Value::as_object);
        let theta_from = rope.unwrap_or(&obj);
        let rope_theta = float_or(theta_from, "rope_theta", 10_000.0)?;
        let scaling = rope.or_else(|| obj.get("rope_scaling").and_then(Value::as_object));
        let config = LlamaConfig {
            vocab_size: int(&obj, "vocab_size")?,
            hidden_size,
            intermediate_size: int(&obj, "intermediate_size")?,
            num_hidden_layers: int(&obj, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: float_or(&obj, "rms_norm_eps", 1e-6)?,
            rope_theta,
            rope_scaling: rope_scaling(scaling)?,
            max_position_embeddings: int(&obj, "max_position_embeddings")?,
            tie_word_embeddings: obj
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            raw: obj,
        };
        if config.hidden_size > 65_536 || config.num_hidden_layers > 1_024 {
            return Err("config.json: the model is implausibly large".into());
        }
        Ok(config)
    }

    /// The `config.json` to write beside weights stored as `dtype` (`"float32"`,
    /// `"bfloat16"`): the one read, with the dtype fields set.
    pub fn to_json(&self, dtype: &str) -> Value {
        let mut raw = self.raw.clone();
        raw.insert("dtype".into(), dtype.into());
        if raw.contains_key("torch_dtype") {
            raw.insert("torch_dtype".into(), dtype.into());
        }
        Value::Object(raw)
    }

    /// The rotary embedding's inverse frequencies (`head_dim / 2` of them), in f64.
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.head_dim as f64;
        let plain = (0..self.head_dim / 2)
            .map(|i| 1.0 / self.rope_theta.powf((2 * i) as f64 / d))
            .collect::<Vec<_>>();
        let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old,
        } = self.rope_scaling
        else {
            return plain;
        };
        let low_freq_wavelen = old / low_freq_factor;
        let high_freq_wavelen = old / high_freq_factor;
        plain
            .into_iter()
            .map(|f| {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                if wavelen > low_freq_wavelen {
                    f / factor
                } else if wavelen < high_freq_wavelen {
                    f
                } else {
                    let smooth =
                        (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    (1.0 - smooth) * f / factor + smooth * f
                }
            })
            .collect()
    }
}

/// The RoPE scaling a `rope_parameters` or `rope_scaling` object names.
fn rope_scaling(obj: Option<&Map<String, Value>>) -> Result<RopeScaling, String> {
    let Some(obj) = obj else {
        return Ok(RopeScaling::Default);
    };
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
        "default" => Ok(RopeScaling::Default),
        "llama3" => {
            let get = |k: &str| {
                obj.get(k)
                    .and_then(Value::as_f64)
                    .ok_or_else(|| format!("config.json: llama3 RoPE scaling lacks `{k}`"))
            };
            Ok(RopeScaling::Llama3 {
                factor: get("factor")?,
                low_freq_factor: get("low_freq_factor")?,
                high_freq_factor: get("high_freq_factor")?,
                original_max_position_embeddings: get("original_max_position_embeddings")?,
            })
        }
        other => Err(format!(
            "config.json: RoPE type {other:?} is not supported (only \"default\" and \"llama3\")"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_spellings_of_rope_theta_and_refuses_what_it_cannot_compute() {
        let base = r#"{"model_type":"llama","vocab_size":96,"hidden_size":32,"intermediate_size":64,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
            "max_position_embeddings":64"#;
        let v5 = LlamaConfig::parse(&format!(
            r#"{base},"rope_parameters":{{"rope_theta":5000.0,"rope_type":"default"}}}}"#
        ))
        .unwrap();
        assert_eq!(v5.rope_theta, 5000.0);
        assert_eq!(v5.head_dim, 8);
        assert!(!v5.tie_word_embeddings);
        let v4 = LlamaConfig::parse(&format!(r#"{base},"rope_theta":500.0}}"#)).unwrap();
        assert_eq!(v4.rope_theta, 500.0);
        assert_eq!(v4.inv_freq()[0], 1.0);
        let err = LlamaConfig::parse(&format!(r#"{base},"attention_bias":true}}"#)).unwrap_err();
        assert!(err.contains("attention_bias"), "{err}");
        let err = LlamaConfig::parse(&format!(
            r#"{base},"rope_scaling":{{"rope_type":"yarn","factor":4.0}}}}"#
        ))
        .unwrap_err();
        assert!(err.contains("yarn"), "{err}");
        let err =
            LlamaConfig::parse(&format!("{}}}", base.replace("llama", "mistral"))).unwrap_err();
        assert!(err.contains("mistral"), "{err}");
    }
}
