//! Warming the device up while the stage loads its inputs.
//!
//! A CUDA process's first training step is slow: cuBLAS and cuBLASLt create their handles and
//! workspaces, and every kernel is loaded into the context on its first use. None of that needs
//! the real model. [`start`] runs one training step of a one-layer model of the stage's width
//! on a batch of the stage's shape (so the same matrix shapes, hence the same kernels) on a
//! thread of its own, while the main thread reads and checks the upstream checkpoint and
//! builds the model; the kernels, handles (returned to libtorch's per-device pools when the
//! thread ends) and cached memory are then ready for the real first step.

use crate::model::ByteGpt;
use crate::optim::AdamW;
use protocol::worker::ModelConfig;
use std::thread::JoinHandle;
use tch::{Device, Kind, Tensor};

/// A warm-up in progress.
pub struct WarmUp(JoinHandle<()>);

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
    let config = ModelConfig {
        n_layers: 1,
        ..config.clone()
    };
    let handle = std::thread::Builder::new()
        .name("warm-up".into())
        .spawn(move || {
            let mut model = ByteGpt::zeroed(&config, device);
            let mut opt = AdamW::new(&model.params, 0.0);
            let shape = [batch as i64, seq_len as i64];
            let ids = Tensor::zeros(shape, (Kind::Int64, device));
            model.params.zero_grad();
            model.loss(&ids, &ids, kind).backward();
            let _ = opt.step(&mut model.params, 0.0);
            tch::Cuda::synchronize(0);
        })
        .ok()?;
    Some(WarmUp(handle))
}

impl WarmUp {
    /// Waits for the warm-up to end (whatever happened to it: it only ever saves time).
    pub fn finish(self) {
        let _ = self.0.join();
    }
}
