//! Warming the device up while the stage loads its inputs.
//!
//! A CUDA process's first training step is slow: cuBLAS and cuBLASLt create their handles and
//! workspaces, and every kernel is loaded into the context on its first use. None of that needs
//! the real model. [`start`] runs one training step of a one-layer model of the stage's width
//! on a batch of the stage's shape (so the same matrix shapes, hence the same kernels) on a
//! thread of its own, while the main thread reads and checks the upstream checkpoint and
//! builds the model; the kernels, handles (returned to libtorch's per-device pools when the
//! thread ends) and cached memory are then ready for the real first step.
//!
//! `STAGE_WORKER_WARMUP` chooses how: `one` (the default: the one-layer step on one thread),
//! `split` (that step, plus the matrix products and the attention of the same shapes on two
//! more threads, so that kernels load in parallel) or `off`. `STAGE_WORKER_TRACE=1` first
//! times each kind of operation on its own (synchronising after each) and logs the times: a
//! diagnostic for the benchmark, slower than a plain warm-up.

use crate::model::optim::AdamW;
use crate::model::ByteGpt;
use protocol::worker::ModelConfig;
use std::thread::JoinHandle;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// A warm-up in progress.
pub struct WarmUp(Vec<JoinHandle<()>>);

/// Whether `STAGE_WORKER_TRACE` asks for timing lines.
pub fn tracing() -> bool {
    std::env::var("STAGE_WORKER_TRACE").is_ok_and(|v| v == "1")
}

/// Starts warming `device` up for a model shaped like `config` (one layer of it) and batches of
/// `batch` × `seq_len` in `kind`. On the CPU there is nothing to warm up: `None`.
pub fn start(
    config: &ModelConfig,
    batch: usize,
    seq_len: usize,
    kind: Kind,
    device: Device,
) -> Option<WarmUp> {
    if !device.is_cuda() {
        return None;
    }
    let mode = std::env::var("STAGE_WORKER_WARMUP").unwrap_or_else(|_| "one".into());
    if mode == "off" {
        return None;
    }
    let config = ModelConfig {
        n_layers: 1,
        ..config.clone()
    };
    let trace = tracing();
    let mut threads = Vec::new();
    let c = config.clone();
    threads.push(spawn("warm-up", move || {
        if trace {
            trace_ops(&c, batch, seq_len, kind, device);
        }
        let t = Instant::now();
        one_step(&c, batch, seq_len, kind, device);
        if trace {
            crate::log!("warm-up: one-layer step {:.1} ms", ms(t));
        }
    })?);
    if mode == "split" && !trace {
        let c = config.clone();
        if let Some(h) = spawn("warm-up-mm", move || {
            let t = Instant::now();
            matmuls(&c, batch, seq_len, kind, device);
            tch::Cuda::synchronize(0);
            crate::log!("warm-up: matrix products {:.1} ms", ms(t));
        }) {
            threads.push(h);
        }
        if let Some(h) = spawn("warm-up-attn", move || {
            let t = Instant::now();
            attention(&config, batch, seq_len, kind, device, true);
            tch::Cuda::synchronize(0);
            crate::log!("warm-up: attention {:.1} ms", ms(t));
        }) {
            threads.push(h);
        }
    }
    Some(WarmUp(threads))
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Option<JoinHandle<()>> {
    std::thread::Builder::new().name(name.into()).spawn(f).ok()
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// One training step of a zeroed model shaped like `config`.
fn one_step(config: &ModelConfig, batch: usize, seq_len: usize, kind: Kind, device: Device) {
    let mut model = ByteGpt::zeroed(config, device);
    let mut opt = AdamW::new(&model.params, 0.0);
    opt.use_kernels(model.fused_kernels(kind));
    let shape = [batch as i64, seq_len as i64];
    let ids = Tensor::zeros(shape, (Kind::Int64, device));
    model.params.zero_grad();
    model.loss(&ids, &ids, kind).backward();
    let _ = opt.step(&mut model.params, 0.0);
    tch::Cuda::synchronize(0);
}

/// The matrix products of one block and of the logits, forward and backward, in `kind`.
fn matmuls(config: &ModelConfig, batch: usize, seq_len: usize, kind: Kind, device: Device) {
    let d = config.d_model;
    let n = (batch * seq_len) as i64;
    for (inp, out) in [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d), (d, 256)] {
        let x = Tensor::zeros([n, inp], (kind, device)).set_requires_grad(true);
        let w = Tensor::zeros([out, inp], (kind, device)).set_requires_grad(true);
        x.linear::<Tensor>(&w, None).sum(Kind::Float).backward();
    }
}

/// Causal attention of the stage's shape, forward (and backward when `grad`).
fn attention(
    config: &ModelConfig,
    batch: usize,
    seq_len: usize,
    kind: Kind,
    device: Device,
    grad: bool,
) {
    let h = config.n_heads;
    let shape = [batch as i64, h, seq_len as i64, config.d_model / h];
    let q = Tensor::zeros(shape, (kind, device)).set_requires_grad(grad);
    let y =
        Tensor::scaled_dot_product_attention::<Tensor>(&q, &q, &q, None, 0.0, true, None, false);
    if grad {
        y.sum(Kind::Float).backward();
    }
}

/// Times each kind of operation of a training step on its own, in the order a first step
/// meets them, and logs the times.
fn trace_ops(config: &ModelConfig, batch: usize, seq_len: usize, kind: Kind, device: Device) {
    let d = config.d_model;
    let n = (batch * seq_len) as i64;
    let mut t = Instant::now();
    let mut lap = |name: &str| {
        tch::Cuda::synchronize(0);
        crate::log!("warm-up trace: {name} {:.1} ms", ms(t));
        t = Instant::now();
    };
    let z = Tensor::zeros([n, d], (Kind::Float, device));
    lap("zeros");
    let zb = z.to_kind(kind);
    lap("cast to compute kind");
    let w = Tensor::zeros([3 * d, d], (kind, device));
    let _ = zb.linear::<Tensor>(&w, None);
    lap("first matrix product (cuBLAS/cuBLASLt handles)");
    let w2 = Tensor::zeros([4 * d, d], (kind, device));
    let _ = zb.linear::<Tensor>(&w2, None);
    lap("second matrix product shape");
    let ln = z.layer_norm([d], None::<&Tensor>, None::<&Tensor>, 1e-5, true);
    lap("layer norm");
    let _ = ln.gelu("none");
    lap("gelu");
    attention(config, batch, seq_len, kind, device, false);
    lap("attention forward");
    attention(config, batch, seq_len, kind, device, true);
    lap("attention forward + backward");
    matmuls(config, batch, seq_len, kind, device);
    lap("matrix products forward + backward");
    // As the model's loss takes it: the fused kernels' where the model's run.
    let fused = crate::kernels::fused::usable(device, kind, d);
    let logits = Tensor::zeros([n, 256], (kind, device)).set_requires_grad(true);
    let tgt = Tensor::zeros([n], (Kind::Int64, device));
    crate::model::cross_entropy_with(&logits, &tgt, fused).backward();
    lap("cross-entropy forward + backward");
    let mut model = ByteGpt::zeroed(config, device);
    lap("one-layer model built");
    let mut opt = AdamW::new(&model.params, 0.0);
    opt.use_kernels(model.fused_kernels(kind));
    lap("optimizer state");
    let ids = Tensor::zeros([batch as i64, seq_len as i64], (Kind::Int64, device));
    let loss = model.loss(&ids, &ids, kind);
    lap("model forward");
    loss.backward();
    lap("model backward");
    let _ = opt.step(&mut model.params, 0.0);
    lap("optimizer step");
}

impl WarmUp {
    /// Waits for the warm-up to end (whatever happened to it: it only ever saves time).
    pub fn finish(self) {
        for h in self.0 {
            let _ = h.join();
        }
    }
}
