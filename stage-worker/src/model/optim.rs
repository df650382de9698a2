//! AdamW with decoupled weight decay, global grad-norm clipping, and the learning-rate schedule.
//!
//! The moments are two fp32 tensors shaped like the model's flat parameter buffer, so the
//! whole update is a few whole-buffer operations, and they save and load as named tensors
//! (one pair per parameter) next to the step count.
//!
//! One update path. Where the model runs the worker's own kernels ([`crate::kernels::fused`]), the
//! step is three kernels of that module (the squares' partial sums, the norm with the
//! clipping scale and the step's bias corrections, the update), which load with the model's
//! kernels. Everywhere else, and whenever those kernels refuse the operands, it is libtorch's
//! own fused AdamW (`_fused_adamw_`, as `torch.optim.AdamW(fused=True)` runs it; called
//! through `csrc/fused_adamw.cpp` since tch does not bind it), which is also the reference
//! the worker's kernels are checked against (`stage-worker check-kernels`). Both take lists:
//! each parameter's own gradient, as autograd left it, next to its slices of the flat
//! parameter and moment buffers, after the global gradient norm is taken for clipping; the
//! gradients are then dropped, so the next backward pass hands its gradients over without
//! zeroing, adding or copying them into one flat gradient. What each choice measured is in
//! `bench/throughput/README.md` ("Where the optimizer step's form came from").

#[cfg(test)]
use crate::model::params::slices_cpu;
use crate::model::params::{load_slices, ParamStore};
use tch::Tensor;

/// Largest global gradient norm; larger gradients are scaled down to it.
pub const CLIP_NORM: f64 = 1.0;
/// The learning rate decays to this fraction of the peak.
pub const MIN_LR_RATIO: f64 = 0.1;

/// Name prefixes of the first and second moments in `optimizer.safetensors`.
pub const EXP_AVG: &str = "exp_avg.";
/// See [`EXP_AVG`].
pub const EXP_AVG_SQ: &str = "exp_avg_sq.";
/// Name of the step count (int64, shape `[1]`) in `optimizer.safetensors`.
pub const STEP_TENSOR: &str = "step";

/// Linear warm-up to the peak, then cosine decay to [`MIN_LR_RATIO`] of it at the last step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Peak learning rate.
    pub peak: f64,
    /// Steps of linear warm-up.
    pub warmup: u64,
    /// Total steps.
    pub total: u64,
}

impl Schedule {
    /// The learning rate for optimizer step `step` (counting from 1).
    pub fn lr(&self, step: u64) -> f64 {
        let min = self.peak * MIN_LR_RATIO;
        if step <= self.warmup {
            return self.peak * step as f64 / self.warmup.max(1) as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1);
        let progress = ((step - self.warmup) as f64 / span as f64).min(1.0);
        min + (self.peak - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// AdamW state.
pub struct AdamW {
    /// First moment, flat like [`ParamStore::flat`].
    pub exp_avg: Tensor,
    /// Second moment, flat like [`ParamStore::flat`].
    pub exp_avg_sq: Tensor,
    /// Optimizer steps taken.
    pub step: u64,
    /// Decoupled weight decay coefficient.
    pub weight_decay: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    /// [`AdamW::step`] as an fp32 tensor on the device, for the fused kernels; made when first
    /// needed.
    step_tensor: Option<Tensor>,
    /// Whether the update runs as the worker's own kernels ([`crate::kernels::fused::adamw_step`]); off
    /// unless [`AdamW::use_kernels`] turned it on.
    kernels: bool,
}

extern "C" {
    /// `csrc/fused_adamw.cpp`: the fused update over per-parameter lists (see
    /// [`AdamW::step`]); on success `*norm_out` is a new tensor handle the caller owns.
    fn stage_worker_adamw_lists(
        leaves: *const *const std::ffi::c_void,
        offsets: *const i64,
        n: usize,
        flat: *const std::ffi::c_void,
        exp_avg: *const std::ffi::c_void,
        exp_avg_sq: *const std::ffi::c_void,
        decay_len: i64,
        step: *const std::ffi::c_void,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        clip_norm: f64,
        norm_out: *mut *mut std::ffi::c_void,
        err: *mut std::ffi::c_char,
        err_len: usize,
    ) -> i32;
}

impl AdamW {
    /// Fresh state (zero moments, step 0) for `params`, with betas (0.9, 0.95) and eps 1e-8.
    pub fn new(params: &ParamStore, weight_decay: f64) -> Self {
        let zeros = || params.flat.zeros_like();
        AdamW {
            exp_avg: zeros(),
            exp_avg_sq: zeros(),
            step: 0,
            weight_decay,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            step_tensor: None,
            kernels: false,
        }
    }

    /// Runs the update as the worker's own kernels ([`crate::kernels::fused::adamw_step`]) when `on`:
    /// pass whether [`crate::kernels::fused::usable`] said yes for the model's device, compute kind and
    /// width, so that the optimizer's kernels run exactly where the model's do. Either way
    /// the update is the same; if the kernels refuse the operands the step falls back to
    /// libtorch's fused AdamW (see [`AdamW::step`]).
    pub fn use_kernels(&mut self, on: bool) {
        self.kernels = on;
    }

    /// Whether the next step runs as the worker's own kernels.
    pub fn kernels(&self) -> bool {
        self.kernels
    }

    /// One update from the gradients in `params` at learning rate `lr`: clip the global
    /// gradient norm to [`CLIP_NORM`], update the moments, decay the weights that take decay by
    /// `lr * weight_decay`, step, and drop every parameter's gradient. Nothing is read back to
    /// the host. Returns the gradient norm before clipping (a device scalar). Panics (a
    /// classified torch failure) when libtorch's own AdamW fails.
    pub fn step(&mut self, params: &mut ParamStore, lr: f64) -> Tensor {
        if self.kernels() {
            match self.step_kernels(params, lr) {
                Ok(norm) => return norm,
                Err(e) => {
                    crate::log!(
                        "note: the worker's AdamW kernels refused the step ({e}); using libtorch's"
                    );
                    self.kernels = false;
                }
            }
        }
        self.step_libtorch(params, lr)
            .unwrap_or_else(|e| panic!("libtorch's fused AdamW failed: {e}"))
    }

    /// [`AdamW::step`] with the worker's own kernels: as [`AdamW::step_libtorch`] (the same
    /// update, the gradients dropped afterwards), with the step counter advanced on the device
    /// by the kernels themselves. An error means nothing changed.
    fn step_kernels(&mut self, params: &mut ParamStore, lr: f64) -> Result<Tensor, String> {
        let step = match self.step_tensor.take() {
            Some(t) => t,
            None => Tensor::from_slice(&[self.step as f32]).to_device(params.flat.device()),
        };
        let constants = crate::kernels::fused::AdamWStep {
            lr,
            betas: (self.beta1, self.beta2),
            weight_decay: self.weight_decay,
            eps: self.eps,
            clip_norm: CLIP_NORM,
        };
        let done = crate::kernels::fused::adamw_step(
            &params.flat_params(),
            &self.exp_avg,
            &self.exp_avg_sq,
            &step,
            &constants,
        );
        // Advanced in place on success, untouched when refused.
        self.step_tensor = Some(step);
        match done {
            Ok(norm) => {
                self.step += 1;
                Ok(norm)
            }
            Err(crate::kernels::fused::StepError::Refused(e)) => Err(e),
            Err(crate::kernels::fused::StepError::Failed(e)) => {
                panic!("the worker's AdamW kernels failed half-way through a step: {e}")
            }
        }
    }

    /// [`AdamW::step`] with libtorch's fused AdamW over per-parameter lists: the parameters'
    /// own gradients, no flat copy of them, and every gradient dropped afterwards (so the next
    /// backward pass hands its gradients over without zeroing or adding). An error means
    /// nothing changed.
    fn step_libtorch(&mut self, params: &mut ParamStore, lr: f64) -> Result<Tensor, String> {
        tch::no_grad(|| {
            let step = match self.step_tensor.take() {
                Some(t) => t,
                None => Tensor::from_slice(&[self.step as f32]).to_device(params.flat.device()),
            };
            let step = step + 1.0;
            let handle = |t: &Tensor| t.as_ptr().cast::<std::ffi::c_void>();
            let leaves: Vec<*const std::ffi::c_void> =
                params.params.iter().map(|p| handle(&p.tensor)).collect();
            let offsets: Vec<i64> = params.params.iter().map(|p| p.offset).collect();
            let mut norm: *mut std::ffi::c_void = std::ptr::null_mut();
            let mut err = [0 as std::ffi::c_char; 512];
            // SAFETY: every pointer is a live tch tensor handle (an `at::Tensor *`) borrowed
            // for the call, `leaves` and `offsets` hold `n` entries each; the C++ side catches
            // every exception, writes at most `err.len()` bytes, NUL-terminated, into `err`,
            // and on success stores a new handle in `norm` that we take over below.
            let rc = unsafe {
                stage_worker_adamw_lists(
                    leaves.as_ptr(),
                    offsets.as_ptr(),
                    leaves.len(),
                    handle(&params.flat),
                    handle(&self.exp_avg),
                    handle(&self.exp_avg_sq),
                    params.decay_len,
                    handle(&step),
                    lr,
                    self.beta1,
                    self.beta2,
                    self.weight_decay,
                    self.eps,
                    CLIP_NORM,
                    &mut norm,
                    err.as_mut_ptr(),
                    err.len(),
                )
            };
            if rc != 0 {
                // SAFETY: the C++ side NUL-terminates what it wrote.
                let text = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) };
                return Err(text.to_string_lossy().into_owned());
            }
            self.step += 1;
            self.step_tensor = Some(step);
            // SAFETY: a handle the C++ side allocated for us, owned by nobody else.
            Ok(unsafe { Tensor::from_ptr(norm.cast()) })
        })
    }

    /// Named CPU tensors of what `optimizer.safetensors` holds: `exp_avg.NAME`, `exp_avg_sq.NAME`
    /// for every parameter, and `step` (tests: a checkpoint streams the flat moments
    /// themselves under these names).
    #[cfg(test)]
    pub fn named_cpu(&self, params: &ParamStore) -> Vec<(String, Tensor)> {
        let mut out = slices_cpu(&self.exp_avg, &params.params, EXP_AVG);
        out.extend(slices_cpu(&self.exp_avg_sq, &params.params, EXP_AVG_SQ));
        out.push((
            STEP_TENSOR.into(),
            Tensor::from_slice(&[self.step as i64]).to_kind(tch::Kind::Int64),
        ));
        out
    }

    /// Restores moments and step from the tensors of `optimizer.safetensors`.
    pub fn load(
        &mut self,
        params: &ParamStore,
        tensors: &[(String, Tensor)],
        what: &str,
    ) -> Result<(), String> {
        let step = tensors
            .iter()
            .find(|(n, _)| n == STEP_TENSOR)
            .ok_or_else(|| format!("{what} lacks the tensor `{STEP_TENSOR}`"))?;
        let step = step.1.int64_value(&[0]);
        if step < 0 {
            return Err(format!("{what} holds a negative step count {step}"));
        }
        let avg: Vec<(String, Tensor)> = tensors
            .iter()
            .filter(|(n, _)| n.starts_with(EXP_AVG) && !n.starts_with(EXP_AVG_SQ))
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        let avg_sq: Vec<(String, Tensor)> = tensors
            .iter()
            .filter(|(n, _)| n.starts_with(EXP_AVG_SQ))
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        if avg.len() + avg_sq.len() + 1 != tensors.len() {
            let stray = tensors
                .iter()
                .find(|(n, _)| {
                    n != STEP_TENSOR && !n.starts_with(EXP_AVG) && !n.starts_with(EXP_AVG_SQ)
                })
                .map(|(n, _)| n.as_str())
                .unwrap_or("?");
            return Err(format!("{what} has a tensor `{stray}` AdamW does not use"));
        }
        load_slices(&self.exp_avg, &params.params, &avg, EXP_AVG, what)?;
        load_slices(&self.exp_avg_sq, &params.params, &avg_sq, EXP_AVG_SQ, what)?;
        self.step = step as u64;
        self.step_tensor = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::params::{Init, ParamSpecs};
    use tch::{Device, Kind};

    #[test]
    fn schedule_warms_up_then_decays_to_a_tenth() {
        crate::testutil::one_torch_thread();
        let s = Schedule {
            peak: 1.0,
            warmup: 10,
            total: 110,
        };
        assert!((s.lr(1) - 0.1).abs() < 1e-12);
        assert!((s.lr(10) - 1.0).abs() < 1e-12);
        assert!((s.lr(60) - 0.55).abs() < 1e-12);
        assert!((s.lr(110) - 0.1).abs() < 1e-12);
        assert!(s.lr(50) > s.lr(90));
    }

    fn store() -> ParamStore {
        let mut p = ParamSpecs::default();
        p.add("w", &[3, 2], Init::Normal(1.0), true);
        p.add("b", &[2], Init::Zeros, false);
        p.build(Device::Cpu, 1)
    }

    #[test]
    fn minimises_a_quadratic_and_clips() {
        crate::testutil::one_torch_thread();
        let mut p = store();
        let mut opt = AdamW::new(&p, 0.0);
        let target = Tensor::from_slice(&[1.0f32, -1.0]);
        let loss_of = |p: &ParamStore| {
            let w = p.get("w");
            let b = p.get("b");
            (w.sum_dim_intlist([0i64].as_slice(), false, Kind::Float) + b - &target)
                .square()
                .sum(Kind::Float)
        };
        let first = loss_of(&p).double_value(&[]);
        for _ in 0..200 {
            p.zero_grad();
            loss_of(&p).backward();
            let norm = opt.step(&mut p, 0.05);
            assert!(norm.double_value(&[]).is_finite());
        }
        let last = loss_of(&p).double_value(&[]);
        assert!(last < first * 0.01, "{first} -> {last}");
        assert_eq!(opt.step, 200);
    }

    /// The update written out as whole-buffer tensor operations from the flat gradient: the
    /// reference libtorch's fused AdamW is checked against here (the worker's kernels are
    /// checked against libtorch's by `check-kernels`, on a GPU).
    fn reference_step(opt: &mut AdamW, params: &mut ParamStore, lr: f64) -> Tensor {
        tch::no_grad(|| {
            opt.step += 1;
            let t = opt.step as f64;
            let bias1 = 1.0 - opt.beta1.powf(t);
            let bias2 = 1.0 - opt.beta2.powf(t);
            let mut grad = params.flat_grad();
            let norm = grad.norm();
            let scale = (CLIP_NORM / (&norm + 1e-6)).clamp_max(1.0);
            grad *= &scale;
            let _ = opt.exp_avg.lerp_(&grad, 1.0 - opt.beta1);
            let _ = grad.square_();
            let _ = opt.exp_avg_sq.lerp_(&grad, 1.0 - opt.beta2);
            // flat - lr / bias1 * m / (sqrt(v / bias2) + eps), decayed first where it applies.
            let k = -bias1 / lr;
            let mut denom = opt.exp_avg_sq.sqrt();
            denom *= k / bias2.sqrt();
            denom += opt.eps * k;
            if opt.weight_decay != 0.0 && params.decay_len > 0 {
                let mut decayed = params.flat.narrow(0, 0, params.decay_len);
                decayed *= 1.0 - lr * opt.weight_decay;
            }
            let _ = params.flat.addcdiv_(&opt.exp_avg, &denom);
            norm
        })
    }

    #[test]
    fn libtorchs_adamw_takes_the_reference_steps_and_drops_the_gradients() {
        crate::testutil::one_torch_thread();
        let mut a = store();
        let mut b = store();
        assert!(a.flat.equal(&b.flat));
        // Weight decay on `w` only; large gradients (clipped) in some steps, small in others.
        let mut libtorch = AdamW::new(&a, 0.1);
        let mut reference = AdamW::new(&b, 0.1);
        for k in 0..12 {
            let scale = if k % 3 == 0 { 50.0 } else { 0.1 };
            let lr = 0.01 * (k + 1) as f64;
            let mut norms = Vec::new();
            for p in [&mut a, &mut b] {
                p.zero_grad();
                ((p.get("w").square().sum(Kind::Float) + p.get("b").sum(Kind::Float)) * scale)
                    .backward();
            }
            norms.push(libtorch.step(&mut a, lr).double_value(&[]));
            norms.push(reference_step(&mut reference, &mut b, lr).double_value(&[]));
            assert!(
                (norms[0] - norms[1]).abs() <= 1e-5 * norms[1].abs(),
                "{norms:?}"
            );
            assert!(
                a.params.iter().all(|p| !p.tensor.grad().defined()),
                "a gradient survived the step"
            );
        }
        assert_eq!(libtorch.step, reference.step);
        let close = |x: &Tensor, y: &Tensor| {
            let diff = (x - y).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "differ by {diff}: {x} {y}");
        };
        close(&a.flat, &b.flat);
        close(&libtorch.exp_avg, &reference.exp_avg);
        close(&libtorch.exp_avg_sq, &reference.exp_avg_sq);
        // A restored state continues with the same steps too.
        let mut restored = AdamW::new(&a, 0.1);
        restored.load(&a, &libtorch.named_cpu(&a), "test").unwrap();
        assert_eq!(restored.step, 12);
    }

    #[test]
    fn on_the_model_libtorchs_adamw_takes_the_reference_steps() {
        // The byte-level GPT (tied embedding, decayed and undecayed parameters), clipped steps
        // at a high learning rate: the two stay within float rounding of each other.
        crate::testutil::one_torch_thread();
        let config = protocol::worker::ModelConfig {
            d_model: 32,
            n_layers: 2,
            n_heads: 4,
            max_seq_len: 16,
        };
        let a = crate::model::ByteGpt::new(&config, Device::Cpu, 7);
        let b = crate::model::ByteGpt::new(&config, Device::Cpu, 7);
        let mut libtorch = AdamW::new(&a.params, 0.1);
        let mut reference = AdamW::new(&b.params, 0.1);
        let ids = Tensor::arange(4 * 16, (Kind::Int64, Device::Cpu))
            .remainder(256)
            .view([4, 16]);
        let targets = ids.roll([-1], [1]);
        let [mut a, mut b] = [a, b];
        for step in 0..5 {
            for m in [&mut a, &mut b] {
                m.params.zero_grad();
                m.loss(&ids, &targets, Kind::Float).backward();
            }
            let _ = libtorch.step(&mut a.params, 3e-3);
            let _ = reference_step(&mut reference, &mut b.params, 3e-3);
            let diff = (&a.params.flat - &b.params.flat)
                .abs()
                .max()
                .double_value(&[]);
            assert!(diff < 1e-5, "step {step}: the two differ by {diff}");
        }
    }

    #[test]
    fn the_kernels_are_off_by_default_and_refused_off_the_gpu_without_changing_the_step() {
        // Asked for on the CPU, the worker's kernels refuse the operands before anything runs;
        // libtorch's list form takes the step instead, exactly as it would have.
        crate::testutil::one_torch_thread();
        let mut a = store();
        let mut b = store();
        let mut asked = AdamW::new(&a, 0.1);
        assert!(!asked.kernels(), "the kernels are on by default");
        asked.use_kernels(true);
        assert!(asked.kernels());
        let mut lists = AdamW::new(&b, 0.1);
        for (p, opt) in [(&mut a, &mut asked), (&mut b, &mut lists)] {
            p.zero_grad();
            (p.get("w").square().sum(Kind::Float) * 50.0).backward();
            let norm = opt.step(p, 0.01);
            assert!(norm.double_value(&[]).is_finite());
        }
        assert!(!asked.kernels(), "the refusal was not remembered");
        assert_eq!(asked.step, 1);
        assert!(a.flat.equal(&b.flat));
        assert!(asked.exp_avg_sq.equal(&lists.exp_avg_sq));
    }

    #[test]
    fn state_round_trips_through_named_tensors() {
        crate::testutil::one_torch_thread();
        let mut p = store();
        let mut opt = AdamW::new(&p, 0.1);
        for _ in 0..3 {
            p.zero_grad();
            p.get("w").square().sum(Kind::Float).backward();
            let _ = opt.step(&mut p, 0.01);
        }
        let saved = opt.named_cpu(&p);
        assert!(saved.iter().any(|(n, _)| n == "exp_avg_sq.w"));
        let mut fresh = AdamW::new(&p, 0.1);
        fresh.load(&p, &saved, "test").unwrap();
        assert_eq!(fresh.step, 3);
        assert!(fresh.exp_avg.equal(&opt.exp_avg));
        assert!(fresh.exp_avg_sq.equal(&opt.exp_avg_sq));
        let mut missing = saved;
        missing.retain(|(n, _)| n != "exp_avg.b");
        assert!(fresh
            .load(&p, &missing, "x")
            .unwrap_err()
            .contains("exp_avg.b"));
    }
}
