//! A Llama-architecture decoder (the computation of transformers' `LlamaForCausalLM`): token
//! embedding, `num_hidden_layers` pre-RMSNorm blocks of grouped-query attention with rotary
//! position embeddings and a SwiGLU MLP, a final RMSNorm and an LM head (tied to the
//! embedding or its own). Parameters carry transformers' state-dict names
//! (`model.layers.0.self_attn.q_proj.weight`, …), so a Hugging Face checkpoint loads by name
//! and the output is one transformers loads (the checkpoints' Hugging Face format reads and
//! writes it).
//!
//! Mixed precision as under autocast: fp32 parameters and residual stream, RMSNorm in fp32,
//! every matrix product (attention included) in the compute kind (bf16 on GPU), weights cast
//! on the way in so gradients reach the fp32 masters; the loss in fp32.
//!
//! Grouped-query attention hands `scaled_dot_product_attention` the key/value heads as they
//! are (`enable_gqa`), not repeated; the rotary tables are made once per length and kind on
//! the model's device and kept. On CUDA in bf16, where the worker's kernels load
//! ([`crate::kernels::fused::available`]), the rotary embedding and SwiGLU's `silu(gate) * up`
//! are one kernel each way (fp32 arithmetic, one rounding to bf16, as transformers computes
//! them under autocast with fp32 tables), and the projections hand the fp32 masters their
//! gradients straight from the matrix product ([`crate::kernels::fused::linear_no_bias`]).

pub mod config;

use crate::model::params::{Init, ParamSpecs, ParamStore};
use config::LlamaConfig;
use std::sync::Mutex;
use tch::{Device, Kind, Reduction, Tensor};

/// Name of this architecture in checkpoint manifests.
pub const ARCH: &str = "llama";

/// The model: its config and its fp32 parameters.
pub struct Llama {
    /// The shape it was built with (and the `config.json` it came from).
    pub config: LlamaConfig,
    /// Its parameters, under transformers' names.
    pub params: ParamStore,
    /// The rotary tables made so far, on the device: (length, kind, for the kernel) -> (cos, sin).
    rope_tables: Mutex<Vec<RopeTables>>,
}

/// The rotary tables for one length and kind: `[t, head_dim]` in `kind` for the plain
/// operations, or `[t, head_dim / 2]` in fp32 for the kernel (`half`).
struct RopeTables {
    t: i64,
    kind: Kind,
    half: bool,
    cos: Tensor,
    sin: Tensor,
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
            rope_tables: Mutex::new(Vec::new()),
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

    /// The projection `name` of `x` in `kind` (no bias): with `fused` on CUDA, one that hands
    /// the fp32 master its gradient straight from the matrix product.
    fn project(&self, x: &Tensor, name: &str, kind: Kind, fused: bool) -> Tensor {
        if fused && x.device().is_cuda() {
            let w = self.p(&format!("{name}.weight"));
            return crate::kernels::fused::linear_no_bias(x, w);
        }
        self.linear(x, name, kind)
    }

    /// The rotary tables `cos` and `sin` for `t` positions, on the model's device: `[t,
    /// head_dim]` in `kind`, or with `half` `[t, head_dim / 2]` in fp32 (the kernel's form);
    /// computed in f64 once per (t, kind, half) and kept.
    fn rope(&self, t: i64, kind: Kind, half: bool) -> (Tensor, Tensor) {
        let mut tables = self.rope_tables.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = tables
            .iter()
            .find(|r| r.t == t && r.kind == kind && r.half == half)
        {
            return (r.cos.shallow_clone(), r.sin.shallow_clone());
        }
        let inv = self.config.inv_freq();
        let n = inv.len();
        let repeats = if half { 1 } else { 2 };
        let mut angles = Vec::with_capacity(t as usize * n * repeats);
        for pos in 0..t {
            for _ in 0..repeats {
                angles.extend(inv.iter().map(|f| pos as f64 * f));
            }
        }
        let a = Tensor::from_slice(&angles)
            .view([t, (repeats * n) as i64])
            .to_device(self.params.device());
        let table_kind = if half { Kind::Float } else { kind };
        let (cos, sin) = (a.cos().to_kind(table_kind), a.sin().to_kind(table_kind));
        tables.push(RopeTables {
            t,
            kind,
            half,
            cos: cos.shallow_clone(),
            sin: sin.shallow_clone(),
        });
        (cos, sin)
    }

    /// Logits `[batch, time, vocab]` in `kind` for input ids `[batch, time]` (int64). Position
    /// `t` sees inputs `0..=t` only; positions count from 0 in every row. On the worker's
    /// kernels where they run for this device and kind.
    pub fn forward(&self, ids: &Tensor, kind: Kind) -> Tensor {
        let fused = crate::kernels::fused::available(self.params.device(), kind);
        self.forward_with(ids, kind, fused)
    }

    /// [`Llama::forward`] with the worker's kernels (`fused`: where
    /// [`crate::kernels::fused::available`] said yes, or on the CPU in bf16, where they run as
    /// host code) or with libtorch's operations only.
    pub fn forward_with(&self, ids: &Tensor, kind: Kind, fused: bool) -> Tensor {
        let (b, t) = ids.size2().expect("ids are [batch, time]");
        let c = &self.config;
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (cos, sin) = self.rope(t, kind, fused);
        // [b, t, heads * hd] -> [b, heads, t, hd], rotated.
        let rotated = |x: Tensor, heads: i64| {
            if fused {
                let x = crate::kernels::fused::rope(&x, &cos, &sin, heads);
                return x.view([b, t, heads, hd]).transpose(1, 2);
            }
            let x = x.view([b, t, heads, hd]).transpose(1, 2);
            let halves = x.split(hd / 2, -1);
            let turned = Tensor::cat(&[-&halves[1], halves[0].shallow_clone()], -1);
            &x * &cos + turned * &sin
        };
        let mut x = Tensor::embedding(self.p("model.embed_tokens.weight"), ids, -1, false, false);
        let mut norms = Norms {
            model: self,
            kind,
            fused: fused && crate::kernels::fused::usable(x.device(), kind, c.hidden_size),
            pending: None,
        };
        for i in 0..c.num_hidden_layers {
            let l = format!("model.layers.{i}");
            let h = norms.next(&mut x, &format!("{l}.input_layernorm.weight"));
            let proj = |name: &str| self.project(&h, &format!("{l}.self_attn.{name}"), kind, fused);
            let q = rotated(proj("q_proj"), nh);
            let k = rotated(proj("k_proj"), nkv);
            let v = proj("v_proj").view([b, t, nkv, hd]).transpose(1, 2);
            let y = Tensor::scaled_dot_product_attention::<Tensor>(
                &q,
                &k,
                &v,
                None,
                0.0,
                true,
                None,
                nkv != nh,
            );
            let y = y.transpose(1, 2).contiguous().view([b, t, nh * hd]);
            let o_proj = format!("{l}.self_attn.o_proj");
            norms.pending = Some(self.project(&y, &o_proj, kind, fused));
            let h = norms.next(&mut x, &format!("{l}.post_attention_layernorm.weight"));
            let gate = self.project(&h, &format!("{l}.mlp.gate_proj"), kind, fused);
            let up = self.project(&h, &format!("{l}.mlp.up_proj"), kind, fused);
            let act = if fused {
                crate::kernels::fused::swiglu(&gate, &up)
            } else {
                gate.silu() * up
            };
            norms.pending = Some(self.project(&act, &format!("{l}.mlp.down_proj"), kind, fused));
        }
        let h = norms.next(&mut x, "model.norm.weight");
        let head = if c.tie_word_embeddings {
            "model.embed_tokens"
        } else {
            "lm_head"
        };
        self.project(&h, head, kind, fused)
    }

    /// Mean cross-entropy (fp32) of the logits for `ids` against `targets`, ignoring targets
    /// equal to [`crate::data::batch::IGNORE`].
    /// On the worker's kernels where they run for this device and kind.
    pub fn loss(&self, ids: &Tensor, targets: &Tensor, kind: Kind) -> Tensor {
        let fused = crate::kernels::fused::available(self.params.device(), kind);
        self.loss_with(ids, targets, kind, fused)
    }

    /// [`Llama::loss`] with the worker's kernels (`fused`, as for [`Llama::forward_with`]; the
    /// cross-entropy kernel reads the bf16 logits without an fp32 copy) or without them.
    pub fn loss_with(&self, ids: &Tensor, targets: &Tensor, kind: Kind, fused: bool) -> Tensor {
        let logits = self.forward_with(ids, kind, fused);
        if fused && kind == Kind::BFloat16 && self.config.vocab_size % 4 == 0 {
            let ignore = crate::data::batch::IGNORE;
            return crate::kernels::fused::cross_entropy_rows(&logits, targets, ignore);
        }
        cross_entropy(&logits, targets)
    }
}

/// The residual stream's adds and RMSNorms in order: each norm first adds the branch output
/// waiting in `pending` (if any) into the stream, then normalises it and casts it to `kind`;
/// with `fused`, add, norm and cast are one kernel each way.
struct Norms<'a> {
    model: &'a Llama,
    kind: Kind,
    fused: bool,
    pending: Option<Tensor>,
}

impl Norms<'_> {
    fn next(&mut self, x: &mut Tensor, name: &str) -> Tensor {
        let (w, eps) = (self.model.p(name), self.model.config.rms_norm_eps);
        let y = self.pending.take();
        if self.fused {
            return match y {
                Some(y) => {
                    let (sum, a) = crate::kernels::fused::residual_rms_norm(x, &y, w, eps);
                    *x = sum;
                    a
                }
                None => crate::kernels::fused::rms_norm_cast(x, w, eps),
            };
        }
        if let Some(y) = y {
            // Not `+=`: autograd still needs the stream as it was (the last RMSNorm's input).
            *x = x.g_add(&y);
        }
        self.model.rms_norm(x, name).to_kind(self.kind)
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

    /// The model on the worker's kernels (here on the CPU in bf16, where the rotary and SwiGLU
    /// and cross-entropy kernels run as host code) computes the logits and parameter gradients
    /// of libtorch's plain operations, to bf16 rounding.
    #[test]
    fn the_fused_forward_matches_the_plain_one_with_its_gradients() {
        crate::testutil::one_torch_thread();
        // A vocabulary the cross-entropy kernel takes (a multiple of 4).
        let mut config = tiny(false);
        config.vocab_size = 52;
        let m = Llama::zeroed(&config, Device::Cpu);
        tch::no_grad(|| {
            tch::manual_seed(3);
            let _ = m.params.flat.shallow_clone().normal_(0.0, 0.2);
        });
        let ids = Tensor::from_slice(&[1i64, 7, 3, 40, 5, 9, 2, 8, 11, 4, 0, 49]).view([2, 6]);
        let ignore = crate::data::batch::IGNORE;
        let targets =
            Tensor::from_slice(&[7i64, 3, 40, 5, 9, ignore, 8, 11, 4, 0, 49, 51]).view([2, 6]);
        let run = |fused: bool| {
            for p in &m.params.params {
                p.tensor.shallow_clone().zero_grad();
            }
            let logits = m.forward_with(&ids, Kind::BFloat16, fused);
            m.loss_with(&ids, &targets, Kind::BFloat16, fused)
                .backward();
            let grads: Vec<Tensor> = m
                .params
                .params
                .iter()
                .map(|p| p.tensor.grad().copy())
                .collect();
            (logits.to_kind(Kind::Float), grads)
        };
        let (plain, plain_grads) = run(false);
        let (fused, fused_grads) = run(true);
        let scale = plain.abs().max().double_value(&[]);
        let diff = (&fused - &plain).abs().max().double_value(&[]);
        assert!(
            diff < 0.03 * scale,
            "logits differ by {diff} (largest {scale})"
        );
        for ((p, a), b) in m.params.params.iter().zip(&fused_grads).zip(&plain_grads) {
            let scale = b.abs().max().double_value(&[]);
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(scale > 0.0, "{}: no gradient", p.name);
            assert!(
                diff < 0.05 * scale,
                "{}: gradients differ by {diff} (largest {scale})",
                p.name
            );
        }
    }
}
