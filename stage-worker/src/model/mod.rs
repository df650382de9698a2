//! The byte-level decoder-only transformer.
//!
//! Token and learned position embeddings, `n_layers` pre-LayerNorm blocks (causal self-attention
//! through `scaled_dot_product_attention`, then a 4× GELU MLP), a final LayerNorm, and an LM
//! head tied to the token embedding. Vocabulary: the 256 byte values.
//!
//! Mixed precision works like autocast: parameters and the residual stream stay fp32,
//! LayerNorms run in fp32, and every matrix product (attention included) runs in the compute
//! kind (bf16 on GPU), with weights cast on the way in so gradients reach the fp32 masters.

pub mod attention;
pub mod llama;
pub mod optim;
pub mod params;

use crate::model::params::{Init, ParamSpecs, ParamStore};
use protocol::worker::ModelConfig;
use tch::{Device, Kind, Reduction, Tensor};

/// Bytes.
pub const VOCAB_SIZE: i64 = 256;
/// Name of this architecture in checkpoint manifests.
pub const ARCH: &str = "byte-gpt";
const LN_EPS: f64 = 1e-5;

/// Checks that a model shape is usable; the message names the offending field.
pub fn validate_config(c: &ModelConfig) -> Result<(), String> {
    for (name, v) in [
        ("d_model", c.d_model),
        ("n_layers", c.n_layers),
        ("n_heads", c.n_heads),
        ("max_seq_len", c.max_seq_len),
    ] {
        if v <= 0 {
            return Err(format!("model.{name} must be positive, got {v}"));
        }
    }
    if c.d_model % c.n_heads != 0 {
        return Err(format!(
            "model.n_heads ({}) must divide model.d_model ({})",
            c.n_heads, c.d_model
        ));
    }
    if c.d_model > 65_536 || c.n_layers > 1_024 || c.max_seq_len > 1 << 20 {
        return Err("model shape is implausibly large".into());
    }
    Ok(())
}

/// The model: its shape and its parameters.
pub struct ByteGpt {
    /// The shape it was built with.
    pub config: ModelConfig,
    /// Its parameters (fp32).
    pub params: ParamStore,
}

impl ByteGpt {
    /// A freshly initialised model on `device`; the weights are a function of `seed` and of
    /// the kind of device (CPU or CUDA, see [`ParamSpecs::build`]). `config` must pass
    /// [`validate_config`].
    pub fn new(config: &ModelConfig, device: Device, seed: u64) -> Self {
        Self::build(config, device, Some(seed))
    }

    /// A model of this shape whose parameters are all zero (a warm-up, or weights about to be
    /// loaded): no random draw at all.
    pub fn zeroed(config: &ModelConfig, device: Device) -> Self {
        Self::build(config, device, None)
    }

    fn build(config: &ModelConfig, device: Device, seed: Option<u64>) -> Self {
        let d = config.d_model;
        let std = 0.02;
        // Output projections feed the residual stream once per layer; scale them down so its
        // variance does not grow with depth.
        let out_std = std / ((2 * config.n_layers) as f64).sqrt();
        let mut p = ParamSpecs::default();
        p.add("wte", &[VOCAB_SIZE, d], Init::Normal(std), true);
        p.add("wpe", &[config.max_seq_len, d], Init::Normal(std), true);
        for i in 0..config.n_layers {
            let b = format!("blocks.{i}");
            p.add(format!("{b}.ln1.weight"), &[d], Init::Ones, false);
            p.add(format!("{b}.ln1.bias"), &[d], Init::Zeros, false);
            p.add(
                format!("{b}.attn.qkv.weight"),
                &[3 * d, d],
                Init::Normal(std),
                true,
            );
            p.add(format!("{b}.attn.qkv.bias"), &[3 * d], Init::Zeros, false);
            p.add(
                format!("{b}.attn.proj.weight"),
                &[d, d],
                Init::Normal(out_std),
                true,
            );
            p.add(format!("{b}.attn.proj.bias"), &[d], Init::Zeros, false);
            p.add(format!("{b}.ln2.weight"), &[d], Init::Ones, false);
            p.add(format!("{b}.ln2.bias"), &[d], Init::Zeros, false);
            p.add(
                format!("{b}.mlp.fc.weight"),
                &[4 * d, d],
                Init::Normal(std),
                true,
            );
            p.add(format!("{b}.mlp.fc.bias"), &[4 * d], Init::Zeros, false);
            p.add(
                format!("{b}.mlp.proj.weight"),
                &[d, 4 * d],
                Init::Normal(out_std),
                true,
            );
            p.add(format!("{b}.mlp.proj.bias"), &[d], Init::Zeros, false);
        }
        p.add("ln_f.weight", &[d], Init::Ones, false);
        p.add("ln_f.bias", &[d], Init::Zeros, false);
        ByteGpt {
            config: config.clone(),
            params: match seed {
                Some(seed) => p.build(device, seed),
                None => p.build_zeroed(device),
            },
        }
    }

    fn layer_norm(&self, x: &Tensor, prefix: &str) -> Tensor {
        x.layer_norm(
            [self.config.d_model],
            Some(self.params.get(&format!("{prefix}.weight"))),
            Some(self.params.get(&format!("{prefix}.bias"))),
            LN_EPS,
            true,
        )
    }

    fn linear(&self, x: &Tensor, prefix: &str, kind: Kind) -> Tensor {
        let w = self.params.get(&format!("{prefix}.weight")).to_kind(kind);
        let b = self.params.get(&format!("{prefix}.bias")).to_kind(kind);
        x.linear(&w, Some(&b))
    }

    /// Logits `[batch, time, 256]` in `kind` for input ids `[batch, time]` (int64, time at
    /// most `max_seq_len`). Position `t` sees inputs `0..=t` only.
    ///
    /// On CUDA in bf16 each LayerNorm runs with the residual add before it and the cast after
    /// it as one kernel ([`crate::kernels::fused`]), and so do the embeddings' lookup and sum;
    /// elsewhere as libtorch's kernels. Same arithmetic.
    pub fn forward(&self, ids: &Tensor, kind: Kind) -> Tensor {
        self.forward_with(ids, kind, self.fused_kernels(kind))
    }

    /// Whether this model computes in `kind` with the worker's own kernels
    /// ([`crate::kernels::fused::usable`] for its device and width): its forward pass, its loss and,
    /// set by the caller with [`crate::model::optim::AdamW::use_kernels`], its optimizer step.
    pub fn fused_kernels(&self, kind: Kind) -> bool {
        crate::kernels::fused::usable(self.params.device(), kind, self.config.d_model)
    }

    /// [`ByteGpt::forward`] with the fused kernels (`fused`, where
    /// [`crate::kernels::fused::usable`] said yes) or libtorch's kernels.
    pub fn forward_with(&self, ids: &Tensor, kind: Kind, fused: bool) -> Tensor {
        let (b, t) = ids.size2().expect("ids are [batch, time]");
        let c = self.config.d_model;
        let h = self.config.n_heads;
        let layers = Layers {
            model: self,
            kind,
            fused,
        };
        let wte = self.params.get("wte");
        let mut x = layers.embedding(ids);
        let mut a = layers.first(&x, "blocks.0.ln1");
        for i in 0..self.config.n_layers {
            let blk = format!("blocks.{i}");
            let qkv = layers.linear(&a, &format!("{blk}.attn.qkv"), false);
            let heads = |t_: &Tensor| t_.view([b, t, h, c / h]).transpose(1, 2);
            let parts = qkv.split(c, -1);
            let y = Tensor::scaled_dot_product_attention::<Tensor>(
                &heads(&parts[0]),
                &heads(&parts[1]),
                &heads(&parts[2]),
                None,
                0.0,
                true,
                None,
                false,
            );
            let y = y.transpose(1, 2).contiguous().view([b, t, c]);
            let y = layers.linear(&y, &format!("{blk}.attn.proj"), false);
            let m;
            (x, m) = layers.after_residual(&x, &y, &format!("{blk}.ln2"));
            let m = layers.linear(&m, &format!("{blk}.mlp.fc"), true);
            let y = layers.linear(&m, &format!("{blk}.mlp.proj"), false);
            let next = if i + 1 < self.config.n_layers {
                format!("blocks.{}.ln1", i + 1)
            } else {
                "ln_f".to_string()
            };
            (x, a) = layers.after_residual(&x, &y, &next);
        }
        a.linear::<Tensor>(&wte.to_kind(kind), None)
    }

    /// Mean cross-entropy (fp32) of the logits for `ids` against `targets`, ignoring targets
    /// equal to [`crate::data::batch::IGNORE`].
    pub fn loss(&self, ids: &Tensor, targets: &Tensor, kind: Kind) -> Tensor {
        let fused = self.fused_kernels(kind);
        let logits = self.forward_with(ids, kind, fused);
        cross_entropy_with(&logits, targets, fused)
    }
}

/// The LayerNorms and linear layers of one forward pass: the fused kernels where
/// [`crate::kernels::fused::usable`] said so, else libtorch's.
struct Layers<'a> {
    model: &'a ByteGpt,
    kind: Kind,
    fused: bool,
}

impl Layers<'_> {
    fn weights(&self, prefix: &str) -> (&Tensor, &Tensor) {
        let p = &self.model.params;
        (
            p.get(&format!("{prefix}.weight")),
            p.get(&format!("{prefix}.bias")),
        )
    }

    /// The token embeddings of `ids` `[B, T]` plus the positions' (fp32 `[B, T, C]`).
    fn embedding(&self, ids: &Tensor) -> Tensor {
        let p = &self.model.params;
        let (wte, wpe) = (p.get("wte"), p.get("wpe"));
        if self.fused {
            return crate::kernels::fused::embedding(wte, wpe, ids);
        }
        let t = ids.size()[1];
        Tensor::embedding(wte, ids, -1, false, false) + wpe.narrow(0, 0, t)
    }

    /// The linear layer `prefix` (then GELU when `gelu`) in the compute kind.
    fn linear(&self, x: &Tensor, prefix: &str, gelu: bool) -> Tensor {
        if self.fused {
            let (w, b) = self.weights(prefix);
            return crate::kernels::fused::linear(x, w, b, gelu);
        }
        let y = self.model.linear(x, prefix, self.kind);
        if gelu {
            y.gelu("none")
        } else {
            y
        }
    }

    /// `layer_norm(x)` in the compute kind.
    fn first(&self, x: &Tensor, prefix: &str) -> Tensor {
        if self.fused {
            let (w, b) = self.weights(prefix);
            return crate::kernels::fused::layer_norm_cast(x, w, b, LN_EPS);
        }
        self.model.layer_norm(x, prefix).to_kind(self.kind)
    }

    /// The residual stream after adding `y` (in `x`'s kind: an fp32 stream stays fp32 when
    /// `y` is bf16), and its LayerNorm in the compute kind.
    fn after_residual(&self, x: &Tensor, y: &Tensor, prefix: &str) -> (Tensor, Tensor) {
        if self.fused {
            let (w, b) = self.weights(prefix);
            return crate::kernels::fused::residual_layer_norm(x, y, w, b, LN_EPS);
        }
        let x = x + y;
        let a = self.model.layer_norm(&x, prefix).to_kind(self.kind);
        (x, a)
    }
}

/// Mean cross-entropy in fp32 over the targets that are not [`crate::data::batch::IGNORE`],
/// with the fused kernels (`fused`, where [`crate::kernels::fused::usable`] said yes for the logits'
/// device and kind) or libtorch's: the cast to fp32, `log_softmax` and the mean negative
/// log-likelihood.
pub fn cross_entropy_with(logits: &Tensor, targets: &Tensor, fused: bool) -> Tensor {
    if fused {
        return crate::kernels::fused::cross_entropy(logits, targets, crate::data::batch::IGNORE);
    }
    logits
        .to_kind(Kind::Float)
        .view([-1, VOCAB_SIZE])
        .cross_entropy_loss::<Tensor>(
            &targets.view([-1]),
            None,
            Reduction::Mean,
            crate::data::batch::IGNORE,
            0.0,
        )
}

/// The model shape and what a loader needs, as stored in a manifest's `model` field.
pub fn manifest_model(config: &ModelConfig) -> serde_json::Map<String, serde_json::Value> {
    let mut m = match serde_json::to_value(config).expect("config serializes") {
        serde_json::Value::Object(m) => m,
        _ => unreachable!("ModelConfig is a struct"),
    };
    m.insert("arch".into(), ARCH.into());
    m.insert("vocab_size".into(), VOCAB_SIZE.into());
    m.insert("tied_embeddings".into(), true.into());
    m.insert("dtype".into(), "float32".into());
    m
}

/// Reads the model shape back from a manifest's `model` field, refusing other architectures.
pub fn config_from_manifest(model: &serde_json::Value) -> Result<ModelConfig, String> {
    let obj = model
        .as_object()
        .ok_or("the manifest's `model` field is not an object")?;
    if let Some(arch) = obj.get("arch") {
        if arch != ARCH {
            return Err(format!(
                "the checkpoint's model is a {arch}, stage-worker loads {ARCH:?} models"
            ));
        }
    }
    if let Some(v) = obj.get("vocab_size") {
        if v != VOCAB_SIZE {
            return Err(format!(
                "the checkpoint's vocab_size is {v}, not {VOCAB_SIZE}"
            ));
        }
    }
    let mut shape = serde_json::Map::new();
    for key in ["d_model", "n_layers", "n_heads", "max_seq_len"] {
        let v = obj
            .get(key)
            .ok_or_else(|| format!("the manifest's `model` lacks `{key}`"))?;
        shape.insert(key.into(), v.clone());
    }
    let config: ModelConfig = serde_json::from_value(serde_json::Value::Object(shape))
        .map_err(|e| format!("the manifest's `model` is malformed: {e}"))?;
    validate_config(&config)?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> ModelConfig {
        ModelConfig {
            d_model: 32,
            n_layers: 2,
            n_heads: 4,
            max_seq_len: 16,
        }
    }

    #[test]
    fn forward_shape_and_causality() {
        crate::testutil::one_torch_thread();
        let m = ByteGpt::new(&tiny(), Device::Cpu, 0);
        let ids = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6]).view([1, 6]);
        let logits = tch::no_grad(|| m.forward(&ids, Kind::Float));
        assert_eq!(logits.size(), vec![1, 6, 256]);
        // Changing the last input must not change earlier positions' logits.
        let ids2 = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 99]).view([1, 6]);
        let logits2 = tch::no_grad(|| m.forward(&ids2, Kind::Float));
        let early = logits.narrow(1, 0, 5);
        let early2 = logits2.narrow(1, 0, 5);
        assert!(early.allclose(&early2, 1e-5, 1e-6, false));
        let last_diff = (logits.narrow(1, 5, 1) - logits2.narrow(1, 5, 1))
            .abs()
            .max();
        assert!(last_diff.double_value(&[]) > 0.0);
    }

    #[test]
    fn same_seed_same_weights() {
        crate::testutil::one_torch_thread();
        let a = ByteGpt::new(&tiny(), Device::Cpu, 3);
        let b = ByteGpt::new(&tiny(), Device::Cpu, 3);
        let c = ByteGpt::new(&tiny(), Device::Cpu, 4);
        assert!(a.params.flat.equal(&b.params.flat));
        assert!(!a.params.flat.equal(&c.params.flat));
    }

    #[test]
    fn manifest_model_round_trips() {
        crate::testutil::one_torch_thread();
        let c = tiny();
        let v = serde_json::Value::Object(manifest_model(&c));
        assert_eq!(config_from_manifest(&v).unwrap(), c);
        let mut bad = v.clone();
        bad["n_heads"] = 5.into();
        assert!(config_from_manifest(&bad).unwrap_err().contains("divide"));
    }

    #[test]
    fn config_validation_names_the_field() {
        crate::testutil::one_torch_thread();
        let mut c = tiny();
        c.n_layers = 0;
        assert!(validate_config(&c).unwrap_err().contains("n_layers"));
    }
}
