//! A Llama-architecture decoder (the computation of transformers' `LlamaForCausalLM`): token
//! embedding, `num_hidden_layers` pre-RMSNorm blocks of grouped-query attention with rotary
//! position embeddings and a SwiGLU MLP, a final RMSNorm and an LM head (tied to the
//! embedding or its own). Parameters carry transformers' state-dict names
//! (`model.layers.0.self_attn.q_proj.weight`, …), so a Hugging Face checkpoint loads by name
//! and the output is one transformers loads ([`hf`]).
//!
//! Mixed precision as under autocast: fp32 parameters and residual stream, RMSNorm in fp32,
//! every matrix product (attention included) in the compute kind (bf16 on GPU), weights cast
//! on the way in so gradients reach the fp32 masters; the loss in fp32.

pub mod config;
pub mod hf;

use crate::model::params::{Init, ParamSpecs, ParamStore};
use config::LlamaConfig;
use tch::{Device, Kind, Reduction, Tensor};

/// Name of this architecture in checkpoint manifests.
pub const ARCH: &str = "llama";

/// The model: its config and its fp32 parameters.
pub struct Llama {
    /// The shape it was built with (and the `config.json` it came from).
    pub config: LlamaConfig,
    /// Its parameters, under transformers' names.
    pub params: ParamStore,
}

/// The parameter names and shapes of `c`, in transformers' order; the bool says whether
/// weight decay applies (matrices yes, RMSNorm gains no).
pub fn param_shapes(c: &LlamaConfig) -> Vec<(String, Vec<i64>, bool)> {
    let (d, ff) = (c.hidden_size, c.intermediate_size);
    let q = c.num_attention_heads * c.head_dim;
    let kv = c.num_key_value_heads * c.head_dim;
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![c.vocab_size, d],
        true,
    )];
    for i in 0..c.num_hidden_layers {
        let l = format!("model.layers.{i}");
        for (name, shape) in [
            ("self_attn.q_proj", [q, d]),
            ("self_attn.k_proj", [kv, d]),
            ("self_attn.v_proj", [kv, d]),
            ("self_attn.o_proj", [d, q]),
            ("mlp.gate_proj", [ff, d]),
            ("mlp.up_proj", [ff, d]),
            ("mlp.down_proj", [d, ff]),
        ] {
            out.push((format!("{l}.{name}.weight"), shape.to_vec(), true));
        }
        out.push((format!("{l}.input_layernorm.weight"), vec![d], false));
        out.push((
            format!("{l}.post_attention_layernorm.weight"),
            vec![d],
            false,
        ));
    }
    out.push(("model.norm.weight".to_string(), vec![d], false));
    if !c.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![c.vocab_size, d], true));
    }
    out
}

impl Llama {
    /// A model shaped `config` on `device` with every parameter zero, about to be loaded.
    pub fn zeroed(config: &LlamaConfig, device: Device) -> Self {
        let mut specs = ParamSpecs::default();
        for (name, shape, decay) in param_shapes(config) {
            let init = if decay {
                Init::Normal(0.02)
            } else {
                Init::Ones
            };
            specs.add(name, &shape, init, decay);
        }
        Llama {
            config: config.clone(),
            params: specs.build_zeroed(device),
        }
    }

    fn p(&self, name: &str) -> &Tensor {
        self.params.get(name)
    }

    /// `x` (fp32) scaled by its root mean square, times the gain `name`, in fp32: libtorch's
    /// `rms_norm` (one fused kernel each way on CUDA), the arithmetic of transformers'
    /// `LlamaRMSNorm` for fp32 input.
    fn rms_norm(&self, x: &Tensor, name: &str) -> Tensor {
        x.rms_norm(
            [self.config.hidden_size],
            Some(self.p(name)),
            self.config.rms_norm_eps,
        )
    }

    fn linear(&self, x: &Tensor, name: &str, kind: Kind) -> Tensor {
        x.linear::<Tensor>(&self.p(&format!("{name}.weight")).to_kind(kind), None)
    }

    /// The rotary tables `cos` and `sin`, `[t, head_dim]` in `kind` (computed in f64).
    fn rope(&self, t: i64, kind: Kind) -> (Tensor, Tensor) {
        let inv = self.config.inv_freq();
        let half = inv.len();
        let mut angles = Vec::with_capacity(t as usize * half * 2);
        for pos in 0..t {
            for _ in 0..2 {
                angles.extend(inv.iter().map(|f| pos as f64 * f));
            }
        }
        let device = self.params.device();
        let a = Tensor::from_slice(&angles)
            .view([t, 2 * half as i64])
            .to_device(device);
        (a.cos().to_kind(kind), a.sin().to_kind(kind))
    }

    /// Logits `[batch, time, vocab]` in `kind` for input ids `[batch, time]` (int64). Position
    /// `t` sees inputs `0..=t` only; positions count from 0 in every row.
    pub fn forward(&self, ids: &Tensor, kind: Kind) -> Tensor {
        let (b, t) = ids.size2().expect("ids are [batch, time]");
        let c = &self.config;
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (cos, sin) = self.rope(t, kind);
        let rotate = |x: Tensor| {
            let halves = x.split(hd / 2, -1);
            let turned = Tensor::cat(&[-&halves[1], halves[0].shallow_clone()], -1);
            &x * &cos + turned * &sin
        };
        let repeat = |x: Tensor| {
            if nkv == nh {
                return x;
            }
            x.unsqueeze(2)
                .expand([b, nkv, nh / nkv, t, hd], false)
                .reshape([b, nh, t, hd])
        };
        let mut x = Tensor::embedding(self.p("model.embed_tokens.weight"), ids, -1, false, false);
        for i in 0..c.num_hidden_layers {
            let l = format!("model.layers.{i}");
            let h = self
                .rms_norm(&x, &format!("{l}.input_layernorm.weight"))
                .to_kind(kind);
            let proj = |name: &str, heads: i64| {
                self.linear(&h, &format!("{l}.self_attn.{name}"), kind)
                    .view([b, t, heads, hd])
                    .transpose(1, 2)
            };
            let q = rotate(proj("q_proj", nh));
            let k = repeat(rotate(proj("k_proj", nkv)));
            let v = repeat(proj("v_proj", nkv));
            let y = Tensor::scaled_dot_product_attention::<Tensor>(
                &q, &k, &v, None, 0.0, true, None, false,
            );
            let y = y.transpose(1, 2).contiguous().view([b, t, nh * hd]);
            // Not `+=`: autograd still needs the stream as it was (the RMSNorm's input).
            x = x.g_add(&self.linear(&y, &format!("{l}.self_attn.o_proj"), kind));
            let h = self
                .rms_norm(&x, &format!("{l}.post_attention_layernorm.weight"))
                .to_kind(kind);
            let gate = self.linear(&h, &format!("{l}.mlp.gate_proj"), kind).silu();
            let up = self.linear(&h, &format!("{l}.mlp.up_proj"), kind);
            x = x.g_add(&self.linear(&(gate * up), &format!("{l}.mlp.down_proj"), kind));
        }
        let h = self.rms_norm(&x, "model.norm.weight").to_kind(kind);
        let head = if c.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        h.linear::<Tensor>(&self.p(head).to_kind(kind), None)
    }

    /// Mean cross-entropy (fp32) of the logits for `ids` against `targets`, ignoring targets
    /// equal to [`crate::data::batch::IGNORE`].
    pub fn loss(&self, ids: &Tensor, targets: &Tensor, kind: Kind) -> Tensor {
        cross_entropy(&self.forward(ids, kind), targets)
    }
}

/// Mean cross-entropy in fp32 of `logits` `[.., vocab]` against `targets`, skipping
/// [`crate::data::batch::IGNORE`].
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Tensor {
    let vocab = *logits.size().last().expect("logits have a vocabulary axis");
    logits
        .to_kind(Kind::Float)
        .view([-1, vocab])
        .cross_entropy_loss::<Tensor>(
            &targets.view([-1]),
            None,
            Reduction::Mean,
            crate::data::batch::IGNORE,
            0.0,
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn tiny(tied: bool) -> LlamaConfig {
        LlamaConfig::parse(&format!(
            r#"{{"model_type":"llama","vocab_size":50,"hidden_size":32,"intermediate_size":48,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
            "max_position_embeddings":64,"rope_theta":1000.0,"tie_word_embeddings":{tied}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn names_follow_transformers_and_a_tied_head_has_none_of_its_own() {
        let untied = param_shapes(&tiny(false));
        let tied = param_shapes(&tiny(true));
        assert_eq!(untied.len(), 1 + 2 * 9 + 1 + 1);
        assert_eq!(tied.len(), untied.len() - 1);
        assert!(untied
            .iter()
            .any(|(n, s, _)| n == "lm_head.weight" && s == &[50, 32]));
        assert!(untied
            .iter()
            .any(|(n, s, _)| n == "model.layers.1.self_attn.k_proj.weight" && s == &[16, 32]));
    }

    #[test]
    fn forward_is_causal() {
        crate::testutil::one_torch_thread();
        let m = Llama::zeroed(&tiny(true), Device::Cpu);
        tch::no_grad(|| {
            tch::manual_seed(1);
            let _ = m.params.flat.shallow_clone().normal_(0.0, 0.2);
        });
        let ids = Tensor::from_slice(&[1i64, 2, 3, 4, 5]).view([1, 5]);
        let ids2 = Tensor::from_slice(&[1i64, 2, 3, 4, 9]).view([1, 5]);
        let (a, b) = tch::no_grad(|| (m.forward(&ids, Kind::Float), m.forward(&ids2, Kind::Float)));
        assert_eq!(a.size(), [1, 5, 50]);
        assert!(a
            .narrow(1, 0, 4)
            .allclose(&b.narrow(1, 0, 4), 1e-5, 1e-6, false));
        assert!(!a
            .narrow(1, 4, 1)
            .allclose(&b.narrow(1, 4, 1), 1e-5, 1e-6, false));
    }
}
