//! Fused CUDA kernels for a training step (`csrc/fused.cpp`): the residual add, LayerNorm
//! and bf16 cast of the model's blocks as one kernel forward and backward; linear layers whose
//! backward pass hands the fp32 masters their gradients directly (the bias's from one
//! column-sum kernel, fused with GELU's backward after the MLP's first layer); the token +
//! position embedding as one kernel each way; the cross-entropy of the bf16 logits (one kernel
//! for the rows' losses and one for their mean, one for the gradient); and the AdamW step
//! ([`adamw_step`]: the gradients' norm, clipping, the update and the step count, three
//! kernels over tables of the parameters).
//!
//! libtorch's eager kernels run one operation each, so around every LayerNorm of a block the
//! activations cross memory about nine times (the add, the norm and the cast forward; the cast
//! back, the norm's two gradients, the sum of the residual's gradients and the branch's cast
//! backward); `torch.compile` fuses them, which was most of its lead over the worker
//! (`bench/throughput/README.md`). The fused kernels do the same arithmetic (fp32, the eager
//! formulas) in one pass each way; sums are taken in another order, so results agree to
//! rounding, not bit for bit.
//!
//! The embedding, the cross-entropy and the optimizer are here for another reason: a new
//! stage's CUDA context loads every distinct kind of libtorch kernel on first use, one after
//! the other (5–20 ms each), and libtorch spends some twenty kinds on them (by our count: the
//! embedding's lookup and its sort-based backward, the cast, `log_softmax` and the loss both
//! ways, the norms and the fused AdamW with its arithmetic); all the kernels here load as one
//! module in a few milliseconds. The embedding's backward pass adds into the token table's
//! gradient atomically, so that sum's order (and its last bits) varies from run to run.
//! `csrc/emulate/run.sh` runs those kernels on the host (a shim for the CUDA built-ins, one
//! host thread per GPU thread) against reference loops, a check without a GPU;
//! `stage-worker check-kernels` is the check on one.
//!
//! They are compiled at first use by NVRTC for the device's architecture (in the warm-up's
//! first step, which runs the same layers) and kept as a cubin in `STAGE_WORKER_KERNEL_CACHE`
//! (default `$XDG_CACHE_HOME/stage-worker/kernels` or `~/.cache/stage-worker/kernels`, named by
//! a hash of the source, the architecture and NVRTC's version), so later stages load them
//! without compiling. They are used on CUDA for widths that are a multiple of 128 up to 4096,
//! in bf16 (the AdamW step wherever the model's layers use them: the model's optimizer switches
//! it on with them). `STAGE_WORKER_FUSED=off` turns them all off; anything they cannot do (no
//! NVRTC, an unsupported width or kind, a failed compile) leaves the stage on the eager
//! kernels, with one line in the log saying why.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU8, Ordering};
use tch::{Device, Kind, Tensor};

extern "C" {
    fn stage_worker_fused_compile(
        arch: i32,
        bytes: *mut usize,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn stage_worker_fused_load(
        ordinal: i32,
        cached: *mut bool,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn stage_worker_residual_layer_norm(
        x: *const c_void,
        y: *const c_void,
        w: *const c_void,
        b: *const c_void,
        eps: f64,
        xn_out: *mut *mut c_void,
        a_out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn stage_worker_fused_optimizer_step(
        leaves: *const *const c_void,
        offsets: *const i64,
        n: usize,
        flat: *const c_void,
        exp_avg: *const c_void,
        exp_avg_sq: *const c_void,
        decay_len: i64,
        step: *const c_void,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        clip_norm: f64,
        norm_out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn stage_worker_embedding(
        wte: *const c_void,
        wpe: *const c_void,
        ids: *const c_void,
        x_out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn stage_worker_cross_entropy(
        logits: *const c_void,
        targets: *const c_void,
        ignore: i64,
        loss_out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn stage_worker_llama_rope(
        x: *const c_void,
        cos: *const c_void,
        sin: *const c_void,
        heads: i64,
        out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn stage_worker_llama_swiglu(
        gate: *const c_void,
        up: *const c_void,
        out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn stage_worker_llama_cross_entropy(
        logits: *const c_void,
        targets: *const c_void,
        ignore: i64,
        loss_out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn stage_worker_linear_bf16(
        x: *const c_void,
        w: *const c_void,
        b: *const c_void,
        gelu: bool,
        y_out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
}

/// Not yet tried / loaded / unavailable.
const UNTRIED: u8 = 0;
const READY: u8 = 1;
const UNAVAILABLE: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNTRIED);

/// What a value of `STAGE_WORKER_FUSED` asks for: `Some(true)` for `auto` (also unset or
/// empty), `Some(false)` for `off`, `None` for anything else.
pub fn wanted_from(value: Option<&str>) -> Option<bool> {
    match value {
        None | Some("") | Some("auto") => Some(true),
        Some("off") => Some(false),
        Some(_) => None,
    }
}

/// [`wanted_from`] this process's `STAGE_WORKER_FUSED` (read once).
pub fn wanted_by_env() -> Option<bool> {
    static CHOSEN: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| wanted_from(std::env::var("STAGE_WORKER_FUSED").ok().as_deref()))
}

/// Whether the fused kernels take activations of width `width` in `kind` on `device`: CUDA,
/// bf16, a multiple of 128 up to 4096, the kernels loaded (compiled on the first call, on the
/// calling thread, whose CUDA context must be current: any thread that has made a tensor on
/// the device). A failure to load is logged once and answers `false` from then on.
pub fn usable(device: Device, kind: Kind, width: i64) -> bool {
    width % 128 == 0 && width <= 4096 && available(device, kind)
}

/// Whether the kernels that take any width (the Llama block's rotary embedding and SwiGLU)
/// run on `device` in `kind`: as [`usable`] without its condition on the width.
pub fn available(device: Device, kind: Kind) -> bool {
    let Device::Cuda(ordinal) = device else {
        return false;
    };
    if kind != Kind::BFloat16 || wanted_by_env() != Some(true) {
        return false;
    }
    match STATE.load(Ordering::Acquire) {
        READY => return true,
        UNAVAILABLE => return false,
        _ => {}
    }
    let mut err = [0 as c_char; 2048];
    let mut cached = false;
    let started = std::time::Instant::now();
    // SAFETY: `cached` and `err` are writable; the C++ side NUL-terminates what it writes and
    // serialises loads behind a mutex.
    let rc = unsafe {
        stage_worker_fused_load(ordinal as i32, &mut cached, err.as_mut_ptr(), err.len())
    };
    if rc == 0 {
        if STATE.swap(READY, Ordering::AcqRel) != READY {
            crate::log!(
                "fused kernels ready in {:.1} ms ({})",
                started.elapsed().as_secs_f64() * 1e3,
                if cached { "from the cache" } else { "compiled" }
            );
        }
        true
    } else {
        if STATE.swap(UNAVAILABLE, Ordering::AcqRel) != UNAVAILABLE {
            crate::log!(
                "fused kernels unavailable, using libtorch's: {}",
                message(&err)
            );
        }
        false
    }
}

fn message(err: &[c_char]) -> String {
    // SAFETY: the C++ side NUL-terminated what it wrote into a zeroed buffer.
    unsafe { CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// A tch handle (an `at::Tensor *`) borrowed for one call into the kernel module.
fn handle(t: &Tensor) -> *const c_void {
    t.as_ptr().cast::<c_void>()
}

/// Runs `call`, one entry of the kernel module that makes one new tensor: it gets the
/// out-pointer for that tensor's handle and a message buffer with its length. Shapes, kinds
/// and devices were checked by the callers' `usable`/`available` and the model, so a non-zero
/// answer is a CUDA error, which panics with `what` and the C++ side's message (the stage
/// reports it like any libtorch error); otherwise the new handle is taken over.
///
/// # Safety
/// `call` passes live handles ([`handle`]) borrowed for the call; the C++ side catches every
/// exception, writes at most the given length of message, NUL-terminated, and on success
/// stores a new handle owned by nobody else.
unsafe fn new_tensor(
    what: &str,
    call: impl FnOnce(*mut *mut c_void, *mut c_char, usize) -> i32,
) -> Tensor {
    let mut out: *mut c_void = std::ptr::null_mut();
    let mut err = [0 as c_char; 1024];
    let rc = call(&mut out, err.as_mut_ptr(), err.len());
    assert!(rc == 0, "{what}: {}", message(&err));
    // SAFETY: a handle the C++ side allocated for us (see above).
    unsafe { Tensor::from_ptr(out.cast()) }
}

/// `(x + y, bf16(layer_norm(x + y) * w + b))` with one kernel each way, for autograd: `x` fp32
/// `[.., C]`, `y` bf16 of its shape, `w` and `b` fp32 `[C]`. Call only where [`usable`] said
/// yes for this device, kind and width.
pub fn residual_layer_norm(
    x: &Tensor,
    y: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
) -> (Tensor, Tensor) {
    let (xn, a) = call(x, Some(y), w, Some(b), eps);
    (xn.expect("the residual variant returns the sum"), a)
}

/// `(x + y, bf16(rms_norm(x + y) * w))` with one kernel each way, for autograd: as
/// [`residual_layer_norm`] with RMSNorm (`x / sqrt(mean(x²) + eps)`, no centring, no bias) in
/// place of LayerNorm; the Llama block's residual add, norm and cast.
pub fn residual_rms_norm(x: &Tensor, y: &Tensor, w: &Tensor, eps: f64) -> (Tensor, Tensor) {
    let (xn, a) = call(x, Some(y), w, None, eps);
    (xn.expect("the residual variant returns the sum"), a)
}

/// `bf16(rms_norm(x) * w)` with one kernel each way, for autograd; as [`residual_rms_norm`]
/// without the add.
pub fn rms_norm_cast(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
    call(x, None, w, None, eps).1
}

/// `bf16(layer_norm(x) * w + b)` with one kernel each way, for autograd; as
/// [`residual_layer_norm`] without the add.
pub fn layer_norm_cast(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Tensor {
    call(x, None, w, Some(b), eps).1
}

/// The LayerNorm kernels (`b` given) or the RMSNorm ones (`b` `None`).
fn call(
    x: &Tensor,
    y: Option<&Tensor>,
    w: &Tensor,
    b: Option<&Tensor>,
    eps: f64,
) -> (Option<Tensor>, Tensor) {
    let mut xn: *mut c_void = std::ptr::null_mut();
    let mut a: *mut c_void = std::ptr::null_mut();
    let mut err = [0 as c_char; 1024];
    // SAFETY: every pointer is a live tch handle (an `at::Tensor *`) borrowed for the call; the
    // C++ side catches every exception, writes at most `err.len()` bytes, NUL-terminated, and
    // on success stores new handles that we take over below.
    let rc = unsafe {
        stage_worker_residual_layer_norm(
            handle(x),
            y.map_or(std::ptr::null(), handle),
            handle(w),
            b.map_or(std::ptr::null(), handle),
            eps,
            &mut xn,
            &mut a,
            err.as_mut_ptr(),
            err.len(),
        )
    };
    // Shapes, kinds and devices were checked by `usable` and the model; a failure here is a
    // CUDA error, which the stage reports like any libtorch error.
    assert!(rc == 0, "fused LayerNorm: {}", message(&err));
    // SAFETY: handles the C++ side allocated for us, owned by nobody else.
    let a = unsafe { Tensor::from_ptr(a.cast()) };
    let xn = (!xn.is_null()).then(|| unsafe { Tensor::from_ptr(xn.cast()) });
    (xn, a)
}

/// `x · bf16(w)ᵀ + bf16(b)` in bf16 (then the exact GELU when `gelu`), for autograd, from the
/// fp32 masters `w` `[out, in]` and `b` `[out]`, as libtorch's `linear` computes it in bf16.
/// Its backward pass differs only in what it hands the masters: the weight's gradient in fp32
/// straight from the matrix product, and the bias's from one column-sum kernel (fused with
/// GELU's backward), in fp32 where libtorch rounds both to bf16 and casts them. Call only where
/// [`usable`] said yes (the width of `x` is then a multiple of 128).
pub fn linear(x: &Tensor, w: &Tensor, b: &Tensor, gelu: bool) -> Tensor {
    linear_with(x, w, Some(b), gelu)
}

/// `x · bf16(w)ᵀ` in bf16 without a bias, as [`linear`] (the weight's gradient in fp32 straight
/// from the matrix product). Call only where [`available`] said yes for `x`'s device and kind.
pub fn linear_no_bias(x: &Tensor, w: &Tensor) -> Tensor {
    linear_with(x, w, None, false)
}

fn linear_with(x: &Tensor, w: &Tensor, b: Option<&Tensor>, gelu: bool) -> Tensor {
    // SAFETY: live borrowed handles (see `new_tensor`).
    unsafe {
        new_tensor("fused linear", |y, err, len| {
            stage_worker_linear_bf16(
                handle(x),
                handle(w),
                b.map_or(std::ptr::null(), handle),
                gelu,
                y,
                err,
                len,
            )
        })
    }
}

/// `wte[ids] + wpe[..T]` (fp32 `[B, T, C]`) with one kernel each way, for autograd: `wte`
/// fp32 `[V, C]`, `wpe` fp32 `[P, C]` with `P >= T`, `ids` int64 `[B, T]` on the same device.
/// The backward pass hands `wte` its gradient summed over the ids (atomic fp32 adds, so the
/// order of the sums varies between runs) and `wpe` its own over the batch, zero for the rows
/// from `T` on; autograd adds any other use of `wte` (the tied output head) to it as usual. An
/// id outside `0..V` takes a zero token embedding and passes on no gradient (libtorch's
/// kernel stops with a device-side assertion instead). Call only where [`usable`] said yes.
pub fn embedding(wte: &Tensor, wpe: &Tensor, ids: &Tensor) -> Tensor {
    // SAFETY: live borrowed handles (see `new_tensor`).
    unsafe {
        new_tensor("fused embedding", |x, err, len| {
            stage_worker_embedding(handle(wte), handle(wpe), handle(ids), x, err, len)
        })
    }
}

/// The mean cross-entropy (an fp32 scalar on the device) of bf16 `logits` `[.., 256]` against
/// int64 `targets` of the leading shape, over the targets other than `ignore`, with one
/// kernel forward (and one summing the rows' losses) and one backward writing the logits'
/// gradient in bf16. No rows counted gives NaN, as libtorch's mean does; a target outside
/// `0..256` counts as ignored (libtorch's kernel stops with a device-side assertion instead).
/// Call only where [`usable`] said yes for the logits' device, kind and width.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor, ignore: i64) -> Tensor {
    // SAFETY: live borrowed handles (see `new_tensor`).
    unsafe {
        new_tensor("fused cross-entropy", |loss, err, len| {
            stage_worker_cross_entropy(handle(logits), handle(targets), ignore, loss, err, len)
        })
    }
}

/// The rotary position embedding of `x` (bf16 `[.., T, heads * head_dim]`, contiguous, row `t`
/// at position `t`) by the tables `cos` and `sin` (fp32 `[T, head_dim / 2]`, the angle of
/// each pair of a head: element `j` with `j + head_dim / 2`), computed in fp32 and rounded once
/// to bf16, with one kernel each way for autograd; transformers' `apply_rotary_pos_emb` with
/// fp32 tables, as under autocast. CUDA tensors where [`available`] said yes, or CPU tensors
/// (the same kernel compiled for the host).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, heads: i64) -> Tensor {
    // SAFETY: live borrowed handles (see `new_tensor`).
    unsafe {
        new_tensor("fused rotary embedding", |out, err, len| {
            stage_worker_llama_rope(handle(x), handle(cos), handle(sin), heads, out, err, len)
        })
    }
}

/// `silu(gate) * up` for bf16 tensors of one shape, computed in fp32 and rounded once, with
/// one kernel each way for autograd (the backward pass writes both gradients). CUDA tensors
/// where [`available`] said yes, or CPU tensors (the same kernels compiled for the host).
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Tensor {
    // SAFETY: live borrowed handles (see `new_tensor`).
    unsafe {
        new_tensor("fused SwiGLU", |out, err, len| {
            stage_worker_llama_swiglu(handle(gate), handle(up), out, err, len)
        })
    }
}

/// The mean cross-entropy (an fp32 scalar) of bf16 `logits` `[.., V]`, `V` a multiple of 4,
/// against int64 `targets` of the leading shape, over the targets other than `ignore` (and
/// outside `0..V`, which count as ignored where libtorch's kernel would stop): one kernel
/// reads each row of logits once forward, one writes their gradient in bf16 backward, with
/// no fp32 copy of the logits (libtorch's path casts them, then takes `log_softmax` and the
/// loss as separate kernels each way). No rows counted gives NaN, as libtorch's mean does.
/// CUDA tensors where [`available`] said yes, or CPU tensors (the same kernels compiled for
/// the host).
pub fn cross_entropy_rows(logits: &Tensor, targets: &Tensor, ignore: i64) -> Tensor {
    // SAFETY: live borrowed handles (see `new_tensor`).
    unsafe {
        new_tensor("fused cross-entropy", |loss, err, len| {
            stage_worker_llama_cross_entropy(
                handle(logits),
                handle(targets),
                ignore,
                loss,
                err,
                len,
            )
        })
    }
}

/// The parameters one AdamW step updates (see [`adamw_step`]), laid out as a model keeps
/// them: one flat fp32 buffer, and each parameter a leaf view of it.
pub struct FlatParams<'a> {
    /// Every parameter's values (fp32), concatenated; the moments are shaped like it.
    pub flat: &'a Tensor,
    /// Each parameter (the leaf that holds its gradient) and its offset in [`Self::flat`], in
    /// buffer order.
    pub leaves: Vec<(&'a Tensor, i64)>,
    /// Length of the prefix of [`Self::flat`] that weight decay applies to.
    pub decay_len: i64,
}

/// The constants of one AdamW step (see [`adamw_step`]).
#[derive(Debug, Clone, Copy)]
pub struct AdamWStep {
    /// The learning rate.
    pub lr: f64,
    /// The moments' decay rates.
    pub betas: (f64, f64),
    /// Decoupled weight decay of the parameters below [`FlatParams::decay_len`].
    pub weight_decay: f64,
    /// Added to the second moment's square root.
    pub eps: f64,
    /// Largest global gradient norm; larger gradients are scaled down to it.
    pub clip_norm: f64,
}

/// Why [`adamw_step`] did not update the parameters.
#[derive(Debug)]
pub enum StepError {
    /// The operands were refused before anything ran: nothing changed, another form of the
    /// update can take over.
    Refused(String),
    /// A launch failed after others had run: the state is partly updated.
    Failed(String),
}

/// One AdamW step with the module's kernels, on the parameters' own gradients (a parameter
/// without one takes zeros): the global gradient norm, the gradients divided by
/// `max((norm + 1e-6) / clip_norm, 1)`, the fp32 step counter `step` (one value on the device)
/// advanced by one and its bias corrections, the moments and parameters updated in place as
/// torch's fused AdamW does, and every gradient dropped afterwards. Nothing is read back to
/// the host. Returns the norm before clipping (a device fp32 scalar). Call only on CUDA where
/// [`usable`] said yes.
pub fn adamw_step(
    params: &FlatParams,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
    step: &Tensor,
    c: &AdamWStep,
) -> Result<Tensor, StepError> {
    let leaves: Vec<*const c_void> = params.leaves.iter().map(|(t, _)| handle(t)).collect();
    let offsets: Vec<i64> = params.leaves.iter().map(|(_, offset)| *offset).collect();
    let mut norm: *mut c_void = std::ptr::null_mut();
    let mut err = [0 as c_char; 1024];
    // SAFETY: every pointer is a live tch handle (an `at::Tensor *`) borrowed for the call,
    // `leaves` and `offsets` hold `leaves.len()` entries each; the C++ side catches every
    // exception, writes at most `err.len()` bytes, NUL-terminated, and on success stores a new
    // handle in `norm` that we take over below.
    let rc = unsafe {
        stage_worker_fused_optimizer_step(
            leaves.as_ptr(),
            offsets.as_ptr(),
            leaves.len(),
            handle(params.flat),
            handle(exp_avg),
            handle(exp_avg_sq),
            params.decay_len,
            handle(step),
            c.lr,
            c.betas.0,
            c.betas.1,
            c.weight_decay,
            c.eps,
            c.clip_norm,
            &mut norm,
            err.as_mut_ptr(),
            err.len(),
        )
    };
    match rc {
        // SAFETY: a handle the C++ side allocated for us, owned by nobody else.
        0 => Ok(unsafe { Tensor::from_ptr(norm.cast()) }),
        1 => Err(StepError::Refused(message(&err))),
        _ => Err(StepError::Failed(message(&err))),
    }
}

/// Compiles the kernels for `sm_<arch>` without a GPU; the cubin's size, or NVRTC's log.
pub fn compile_for(arch: i32) -> Result<usize, String> {
    let mut bytes = 0usize;
    let mut err = [0 as c_char; 4096];
    // SAFETY: `bytes` and `err` are writable; the C++ side NUL-terminates what it writes.
    let rc = unsafe { stage_worker_fused_compile(arch, &mut bytes, err.as_mut_ptr(), err.len()) };
    if rc == 0 {
        Ok(bytes)
    } else {
        Err(message(&err))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels' source compiles with the NVRTC of the wheel the worker links, for the
    /// architectures of the GPUs it is benchmarked on (no GPU needed): a syntax or type error in
    /// the CUDA source fails here, not on the first GPU that runs it.
    #[test]
    fn the_kernels_compile_for_ampere_and_hopper() {
        for arch in [80, 90] {
            let bytes = compile_for(arch).unwrap_or_else(|e| panic!("sm_{arch}: {e}"));
            assert!(bytes > 1000, "sm_{arch}: a cubin of {bytes} bytes");
        }
    }

    #[test]
    fn the_setting_is_auto_or_off_and_anything_else_is_refused() {
        assert_eq!(wanted_from(None), Some(true));
        assert_eq!(wanted_from(Some("")), Some(true));
        assert_eq!(wanted_from(Some("auto")), Some(true));
        assert_eq!(wanted_from(Some("off")), Some(false));
        assert_eq!(wanted_from(Some("no")), None);
        assert_eq!(wanted_from(Some("OFF")), None);
    }

    fn bf16_normal(shape: &[i64], seed: i64) -> Tensor {
        tch::manual_seed(seed);
        Tensor::randn(shape, (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16)
    }

    /// Back-propagates `g` (the output's gradient) from `out`.
    fn pull(out: &Tensor, g: &Tensor) {
        (out.to_kind(Kind::Float) * g.to_kind(Kind::Float))
            .sum(Kind::Float)
            .backward();
    }

    /// The largest difference of `a` and `b` (any kind) relative to `b`'s largest value.
    fn relative(a: &Tensor, b: &Tensor) -> f64 {
        let (a, b) = (a.to_kind(Kind::Double), b.to_kind(Kind::Double));
        (a - &b).abs().max().double_value(&[]) / b.abs().max().double_value(&[])
    }

    /// The rotary kernel (run on the host) against the plain operations in fp32 (transformers'
    /// `rotate_half` form), values and the input's gradient, on a `[B, T, H * D]` input.
    #[test]
    fn the_rotary_kernel_matches_the_plain_operations_and_their_gradient() {
        crate::testutil::one_torch_thread();
        let (b, t, h, d) = (2, 5, 3, 8);
        let x = bf16_normal(&[b, t, h * d], 1).set_requires_grad(true);
        let angles = Tensor::arange(t, (Kind::Double, Device::Cpu)).unsqueeze(1)
            * Tensor::from_slice(&[1.0, 0.3, 0.05, 0.01]).unsqueeze(0);
        let (cos, sin) = (
            angles.cos().to_kind(Kind::Float),
            angles.sin().to_kind(Kind::Float),
        );
        let fused = rope(&x, &cos, &sin, h);
        let g = bf16_normal(&[b, t, h * d], 2);
        pull(&fused, &g);
        let fused_grad = x.grad().copy();

        let xf = x.detach().to_kind(Kind::Float).set_requires_grad(true);
        let heads = xf.view([b, t, h, d]);
        let full = |tab: &Tensor| Tensor::cat(&[tab, tab], -1).view([1, t, 1, d]);
        let halves = heads.split(d / 2, -1);
        let turned = Tensor::cat(&[-&halves[1], halves[0].shallow_clone()], -1);
        let plain = (&heads * full(&cos) + turned * full(&sin)).view([b, t, h * d]);
        pull(&plain, &g);
        assert_eq!(fused.kind(), Kind::BFloat16);
        assert_eq!(fused.size(), plain.size());
        // One rounding to bf16 of the fp32 values: half a unit in the last place.
        assert!(
            relative(&fused, &plain) < 1.0 / 128.0,
            "{}",
            relative(&fused, &plain)
        );
        let ref_grad = xf.grad();
        assert!(relative(&fused_grad, &ref_grad) < 1.0 / 128.0);
        // Not a mere copy: the rotation moved the values.
        assert!(relative(&x.detach(), &plain) > 0.1);
    }

    /// The SwiGLU kernels (run on the host) against `silu(gate) * up` in fp32, values and both
    /// gradients.
    #[test]
    fn the_swiglu_kernels_match_the_plain_operations_and_their_gradients() {
        crate::testutil::one_torch_thread();
        let gate = (bf16_normal(&[3, 7, 13], 3) * 3).set_requires_grad(true);
        let up = bf16_normal(&[3, 7, 13], 4).set_requires_grad(true);
        let fused = swiglu(&gate, &up);
        let g = bf16_normal(&[3, 7, 13], 5);
        pull(&fused, &g);

        let gf = gate.detach().to_kind(Kind::Float).set_requires_grad(true);
        let uf = up.detach().to_kind(Kind::Float).set_requires_grad(true);
        let plain = gf.silu() * &uf;
        pull(&plain, &g);
        assert_eq!(fused.kind(), Kind::BFloat16);
        assert!(relative(&fused, &plain) < 1.0 / 128.0);
        assert!(relative(&gate.grad(), &gf.grad()) < 1.0 / 128.0);
        assert!(relative(&up.grad(), &uf.grad()) < 1.0 / 128.0);
    }

    /// The large-vocabulary cross-entropy kernels (run on the host) against libtorch's
    /// cross-entropy of the fp32 logits: the loss, with ignored targets, and the logits'
    /// gradient.
    #[test]
    fn the_cross_entropy_kernels_match_the_plain_loss_and_its_gradient() {
        crate::testutil::one_torch_thread();
        let logits = (bf16_normal(&[2, 5, 36], 6) * 4).set_requires_grad(true);
        let targets = Tensor::from_slice(&[3i64, 35, -100, 0, 17, 8, -100, 21, 2, 30]).view([2, 5]);
        let loss = cross_entropy_rows(&logits, &targets, -100);
        loss.backward();
        let lf = logits.detach().to_kind(Kind::Float).set_requires_grad(true);
        let plain = lf.view([-1, 36]).cross_entropy_loss::<Tensor>(
            &targets.view([-1]),
            None,
            tch::Reduction::Mean,
            -100,
            0.0,
        );
        plain.backward();
        assert_eq!(loss.kind(), Kind::Float);
        let (a, b) = (loss.double_value(&[]), plain.double_value(&[]));
        assert!((a - b).abs() < 1e-5 * b.abs(), "{a} vs {b}");
        assert!(relative(&logits.grad(), &lf.grad()) < 1.0 / 128.0);
        // The ignored rows get no gradient.
        let ignored = logits.grad().get(0).get(2).abs().max().double_value(&[]);
        assert_eq!(ignored, 0.0);
    }

    /// Off the GPU (and for shapes or kinds the kernels do not take) the model keeps libtorch's
    /// eager kernels.
    #[test]
    fn only_cuda_bf16_widths_of_128_up_to_4096_are_fused() {
        assert!(!usable(Device::Cpu, Kind::BFloat16, 1024));
        assert!(!usable(Device::Cuda(0), Kind::Float, 1024));
        assert!(!usable(Device::Cuda(0), Kind::BFloat16, 1000));
        assert!(!usable(Device::Cuda(0), Kind::BFloat16, 8192));
    }
}
