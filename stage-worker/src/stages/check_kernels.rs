//! `stage-worker check-kernels`: the fused kernels ([`crate::kernels::fused`]) against libtorch's on
//! this machine's GPU, values and speed.
//!
//! For each width it builds one random LayerNorm problem (a residual stream in fp32, a branch
//! output in bf16, LayerNorm parameters near their trained values, random gradients for both
//! outputs), runs it forward and backward both ways and reports the largest difference of
//! every output and gradient relative to the largest eager value; then the same for three
//! linear layers (one with GELU), the token + position embedding (output and both tables'
//! gradients), the cross-entropy of bf16 logits (loss and the logits' gradient, some targets
//! ignored), and four AdamW steps with the worker's kernels against libtorch's fused AdamW on
//! identical parameters and gradients (the returned norms, the parameters' updates, both
//! moments, the gradients dropped); then one training step's loss and parameter gradients of a
//! two-layer model with every fused kernel against none, and the same for a two-layer Llama
//! (grouped-query attention; its RMSNorm, rotary, SwiGLU, projection and cross-entropy
//! kernels); also the time of a forward +
//! backward of the LayerNorm op each way and of an AdamW step of a 300M-parameter model each
//! way. One JSON object per line on stdout; the exit status
//! is 1 when a difference is beyond its tolerance (or the kernels cannot run here), else 0.

use crate::model::optim::AdamW;
use crate::model::params::ParamStore;
use crate::model::ByteGpt;
use protocol::worker::ModelConfig;
use serde_json::json;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// bf16 outputs may differ by a unit in the last place where the fp32 values before rounding
/// differ by rounding (2^-8 of the value); fp32 ones by the order of their sums.
const BF16_TOLERANCE: f64 = 1.0 / 64.0;
const FP32_TOLERANCE: f64 = 1e-4;
/// A whole model's gradients: bf16 matrix products downstream of a one-ulp difference.
const MODEL_TOLERANCE: f64 = 3e-2;
/// AdamW's updates: the same fp32 formulas as torch's fused kernel (which takes some products
/// in double), so a few roundings per step apart.
const OPTIMIZER_TOLERANCE: f64 = 1e-4;

/// Runs the checks; the process's exit status.
pub fn run() -> i32 {
    tch::manual_seed(0);
    if !tch::Cuda::is_available() {
        println!("{}", json!({"error": "no CUDA device"}));
        return 1;
    }
    let device = Device::Cuda(0);
    if !crate::kernels::fused::usable(device, Kind::BFloat16, 1024) {
        println!(
            "{}",
            json!({"error": "the fused kernels cannot run here (see the log)"})
        );
        return 1;
    }
    let started = Instant::now();
    let compiled = crate::kernels::fused::compile_for(90);
    println!(
        "{}",
        json!({"compile": "sm_90, once more, off the GPU", "ms": started.elapsed().as_secs_f64() * 1e3,
               "cubin_bytes": compiled.as_ref().ok(), "error": compiled.as_ref().err()})
    );
    let mut ok = true;
    for width in [1024, 2048] {
        ok &= op_check(device, 8192, width, true);
        ok &= op_check(device, 8192, width, false);
        op_speed(device, 8192, width);
    }
    for (inputs, outputs, gelu) in [(1024, 3072, false), (1024, 4096, true), (4096, 1024, false)] {
        ok &= linear_check(device, 8192, inputs, outputs, gelu);
    }
    ok &= embedding_check(device, 8, 512, 1024);
    ok &= cross_entropy_check(device, 8, 1024);
    ok &= optimizer_check(device);
    optimizer_speed(device);
    ok &= model_check(device);
    ok &= llama_check(device);
    i32::from(!ok)
}

/// The largest |a - b| over the largest |b|.
fn relative(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_kind(Kind::Float);
    let b = b.to_kind(Kind::Float);
    let scale = b.abs().max().double_value(&[]).max(1e-30);
    (a - b).abs().max().double_value(&[]) / scale
}

struct Problem {
    x: Tensor,
    y: Tensor,
    w: Tensor,
    b: Tensor,
    grad_a: Tensor,
    grad_xn: Tensor,
}

fn problem(device: Device, rows: i64, width: i64) -> Problem {
    let opts = (Kind::Float, device);
    let x = Tensor::randn([rows, width], opts);
    let y = Tensor::randn([rows, width], opts).to_kind(Kind::BFloat16);
    let w = Tensor::randn([width], opts) * 0.1 + 1.0;
    let b = Tensor::randn([width], opts) * 0.1;
    Problem {
        x,
        y,
        w,
        b,
        grad_a: Tensor::randn([rows, width], opts).to_kind(Kind::BFloat16),
        grad_xn: Tensor::randn([rows, width], opts),
    }
}

/// Outputs and gradients (x, y, w, b) of one pass, fused or eager.
fn pass(p: &Problem, residual: bool, fused: bool) -> Vec<(&'static str, Tensor)> {
    let leaf = |t: &Tensor| t.detach().set_requires_grad(true);
    let (x, y, w, b) = (leaf(&p.x), leaf(&p.y), leaf(&p.w), leaf(&p.b));
    let (xn, a) = match (residual, fused) {
        (true, true) => {
            let (xn, a) = crate::kernels::fused::residual_layer_norm(&x, &y, &w, &b, 1e-5);
            (Some(xn), a)
        }
        (false, true) => (
            None,
            crate::kernels::fused::layer_norm_cast(&x, &w, &b, 1e-5),
        ),
        (true, false) => {
            let xn = &x + &y;
            let a = xn
                .layer_norm([p.x.size()[1]], Some(&w), Some(&b), 1e-5, true)
                .to_kind(Kind::BFloat16);
            (Some(xn), a)
        }
        (false, false) => (
            None,
            x.layer_norm([p.x.size()[1]], Some(&w), Some(&b), 1e-5, true)
                .to_kind(Kind::BFloat16),
        ),
    };
    let mut loss = (a.to_kind(Kind::Float) * p.grad_a.to_kind(Kind::Float)).sum(Kind::Float);
    if let Some(xn) = &xn {
        loss += (xn * &p.grad_xn).sum(Kind::Float);
    }
    loss.backward();
    let mut out = vec![("a", a.detach())];
    if let Some(xn) = xn {
        out.push(("xn", xn.detach()));
        out.push(("grad_y", y.grad()));
    }
    out.push(("grad_x", x.grad()));
    out.push(("grad_w", w.grad()));
    out.push(("grad_b", b.grad()));
    out
}

fn op_check(device: Device, rows: i64, width: i64, residual: bool) -> bool {
    let p = problem(device, rows, width);
    let fused = pass(&p, residual, true);
    let eager = pass(&p, residual, false);
    let mut ok = true;
    let mut diffs = serde_json::Map::new();
    for ((name, f), (_, e)) in fused.iter().zip(&eager) {
        let d = relative(f, e);
        let tolerance = match *name {
            "a" | "grad_y" => BF16_TOLERANCE,
            _ => FP32_TOLERANCE,
        };
        ok &= d <= tolerance;
        diffs.insert((*name).into(), json!(d));
    }
    println!(
        "{}",
        json!({"check": if residual { "residual_layer_norm" } else { "layer_norm_cast" },
               "rows": rows, "width": width, "relative_difference": diffs, "ok": ok})
    );
    ok
}

/// Milliseconds per forward + backward of the residual op, fused and eager (the median of
/// five timings of 20 passes each).
fn op_speed(device: Device, rows: i64, width: i64) {
    let p = problem(device, rows, width);
    let time = |fused: bool| {
        let mut runs: Vec<f64> = (0..5)
            .map(|_| {
                tch::Cuda::synchronize(0);
                let t = Instant::now();
                for _ in 0..20 {
                    let _ = pass(&p, true, fused);
                }
                tch::Cuda::synchronize(0);
                t.elapsed().as_secs_f64() * 1e3 / 20.0
            })
            .collect();
        runs.sort_by(f64::total_cmp);
        runs[2]
    };
    let (fused, eager) = (time(true), time(false));
    println!(
        "{}",
        json!({"speed": "residual_layer_norm forward + backward (with the test's loss)",
               "rows": rows, "width": width, "fused_ms": fused, "eager_ms": eager})
    );
}

/// A linear layer (with GELU when `gelu`) fused and eager: the output and the gradients of the
/// input, the weight and the bias (the fused ones are not rounded to bf16, hence bf16's
/// tolerance for the masters' gradients).
fn linear_check(device: Device, rows: i64, inputs: i64, outputs: i64, gelu: bool) -> bool {
    let opts = (Kind::Float, device);
    let x = Tensor::randn([rows, inputs], opts).to_kind(Kind::BFloat16);
    let w = Tensor::randn([outputs, inputs], opts) * (1.0 / (inputs as f64).sqrt());
    let b = Tensor::randn([outputs], opts) * 0.1;
    let grad = Tensor::randn([rows, outputs], opts);
    let run = |fused: bool| {
        let leaf = |t: &Tensor| t.detach().set_requires_grad(true);
        let (x, w, b) = (leaf(&x), leaf(&w), leaf(&b));
        let y = if fused {
            crate::kernels::fused::linear(&x, &w, &b, gelu)
        } else {
            let y = x.linear(&w.to_kind(Kind::BFloat16), Some(&b.to_kind(Kind::BFloat16)));
            if gelu {
                y.gelu("none")
            } else {
                y
            }
        };
        (y.to_kind(Kind::Float) * &grad).sum(Kind::Float).backward();
        vec![y.detach(), x.grad(), w.grad(), b.grad()]
    };
    let (fused, eager) = (run(true), run(false));
    let mut diffs = serde_json::Map::new();
    let mut ok = true;
    for (name, (f, e)) in ["y", "grad_x", "grad_w", "grad_b"]
        .iter()
        .zip(fused.iter().zip(&eager))
    {
        let d = relative(f, e);
        ok &= d <= BF16_TOLERANCE;
        diffs.insert((*name).into(), json!(d));
    }
    println!(
        "{}",
        json!({"check": if gelu { "linear_gelu" } else { "linear" }, "rows": rows,
               "in": inputs, "out": outputs, "relative_difference": diffs, "ok": ok})
    );
    ok
}

/// The token + position embedding fused and eager (`embedding` plus a slice of the positions):
/// the output and the gradients of both tables, with ids covering every byte many times so
/// that the token table's gradient sums many rows each.
fn embedding_check(device: Device, batch: i64, time: i64, width: i64) -> bool {
    let opts = (Kind::Float, device);
    let wte = Tensor::randn([256, width], opts) * 0.02;
    let wpe = Tensor::randn([2 * time, width], opts) * 0.02;
    let ids = Tensor::randint(256, [batch, time], (Kind::Int64, device));
    let grad = Tensor::randn([batch, time, width], opts);
    let run = |fused: bool| {
        let leaf = |t: &Tensor| t.detach().set_requires_grad(true);
        let (wte, wpe) = (leaf(&wte), leaf(&wpe));
        let x = if fused {
            crate::kernels::fused::embedding(&wte, &wpe, &ids)
        } else {
            Tensor::embedding(&wte, &ids, -1, false, false) + wpe.narrow(0, 0, time)
        };
        (&x * &grad).sum(Kind::Float).backward();
        vec![x.detach(), wte.grad(), wpe.grad()]
    };
    let (fused, eager) = (run(true), run(false));
    let mut diffs = serde_json::Map::new();
    let mut ok = true;
    for (name, (f, e)) in ["x", "grad_wte", "grad_wpe"]
        .iter()
        .zip(fused.iter().zip(&eager))
    {
        let d = relative(f, e);
        ok &= d <= FP32_TOLERANCE;
        diffs.insert((*name).into(), json!(d));
    }
    println!(
        "{}",
        json!({"check": "embedding", "batch": batch, "time": time, "width": width,
               "relative_difference": diffs, "ok": ok})
    );
    ok
}

/// The cross-entropy of bf16 logits fused and eager (the cast to fp32, `log_softmax`, the
/// mean negative log-likelihood): the loss and the logits' gradient (bf16) under an upstream
/// gradient other than 1, with about one target in ten ignored.
fn cross_entropy_check(device: Device, batch: i64, time: i64) -> bool {
    let logits =
        (Tensor::randn([batch, time, 256], (Kind::Float, device)) * 3.0).to_kind(Kind::BFloat16);
    let ignored = Tensor::rand([batch, time], (Kind::Float, device)).lt(0.1);
    let targets = Tensor::randint(256, [batch, time], (Kind::Int64, device))
        .masked_fill(&ignored, crate::data::batch::IGNORE);
    let run = |fused: bool| {
        let logits = logits.detach().set_requires_grad(true);
        let loss = crate::model::cross_entropy_with(&logits, &targets, fused);
        (&loss * 1.7).backward();
        (loss.detach(), logits.grad())
    };
    let ((loss_f, grad_f), (loss_e, grad_e)) = (run(true), run(false));
    let d_loss = relative(&loss_f, &loss_e);
    let d_grad = relative(&grad_f, &grad_e);
    let ok = d_loss <= FP32_TOLERANCE && d_grad <= BF16_TOLERANCE;
    println!(
        "{}",
        json!({"check": "cross_entropy", "rows": batch * time, "loss_fused": loss_f.double_value(&[]),
               "loss_eager": loss_e.double_value(&[]),
               "relative_difference": {"loss": d_loss, "grad_logits": d_grad}, "ok": ok})
    );
    ok
}

/// A few AdamW steps with the worker's kernels and with libtorch's fused kernel on lists, from
/// identical parameters and gradients: a six-layer model's 76 tensors (two launches' tables),
/// weight decay on the matrices, one parameter left without a gradient, and gradients large
/// enough to be clipped in some steps and not in others. Compares the returned norms, the
/// parameters' updates and both moments.
fn optimizer_check(device: Device) -> bool {
    let config = ModelConfig {
        d_model: 256,
        n_layers: 6,
        n_heads: 4,
        max_seq_len: 128,
    };
    let mut models = [
        ByteGpt::new(&config, device, 2),
        ByteGpt::new(&config, device, 2),
    ];
    let start = models[0].params.flat.copy();
    let mut opts = [
        AdamW::new(&models[0].params, 0.1),
        AdamW::new(&models[1].params, 0.1),
    ];
    opts[0].use_kernels(true);
    let mut norms = [Vec::new(), Vec::new()];
    for (k, scale) in [10.0, 1e-3, 3.0, 1e-4].into_iter().enumerate() {
        let grads: Vec<Tensor> = models[0]
            .params
            .params
            .iter()
            .map(|p| Tensor::randn(p.shape.as_slice(), (Kind::Float, device)) * scale)
            .collect();
        for ((m, opt), norms) in models.iter_mut().zip(&mut opts).zip(&mut norms) {
            set_gradients(m, &grads);
            let norm = opt.step(&mut m.params, 1e-2 * (k + 1) as f64);
            norms.push(norm.double_value(&[]));
        }
    }
    let mut diffs = serde_json::Map::new();
    let mut ok = opts[0].kernels();
    let worst_norm = norms[0]
        .iter()
        .zip(&norms[1])
        .map(|(a, b)| (a - b).abs() / b.abs().max(1e-30))
        .fold(0.0f64, f64::max);
    ok &= worst_norm <= FP32_TOLERANCE;
    diffs.insert("norm".into(), json!(worst_norm));
    let update = |m: &ByteGpt| &m.params.flat - &start;
    for (name, a, b, tolerance) in [
        (
            "update",
            update(&models[0]),
            update(&models[1]),
            OPTIMIZER_TOLERANCE,
        ),
        (
            "exp_avg",
            opts[0].exp_avg.shallow_clone(),
            opts[1].exp_avg.shallow_clone(),
            FP32_TOLERANCE,
        ),
        (
            "exp_avg_sq",
            opts[0].exp_avg_sq.shallow_clone(),
            opts[1].exp_avg_sq.shallow_clone(),
            FP32_TOLERANCE,
        ),
    ] {
        let d = relative(&a, &b);
        ok &= d <= tolerance;
        diffs.insert(name.into(), json!(d));
    }
    let dropped = models[0]
        .params
        .params
        .iter()
        .all(|p| !p.tensor.grad().defined());
    ok &= dropped;
    println!(
        "{}",
        json!({"check": "adamw (4 steps, 76 tensors, clipped and not)", "kernels": opts[0].kernels(),
               "gradients_dropped": dropped, "norms_kernels": norms[0], "norms_libtorch": norms[1],
               "relative_difference": diffs, "ok": ok})
    );
    ok
}

/// Milliseconds per AdamW step over a 24-layer 1024-wide model's gradients (about 300M
/// parameters), the worker's kernels and libtorch's fused kernel on lists (the median of five
/// steps each, the gradients set before each step and not timed).
fn optimizer_speed(device: Device) {
    let config = ModelConfig {
        d_model: 1024,
        n_layers: 24,
        n_heads: 16,
        max_seq_len: 1024,
    };
    let mut model = ByteGpt::zeroed(&config, device);
    let grads: Vec<Tensor> = model
        .params
        .params
        .iter()
        .map(|p| Tensor::randn(p.shape.as_slice(), (Kind::Float, device)) * 1e-3)
        .collect();
    let mut time = |kernels: bool| {
        let mut opt = AdamW::new(&model.params, 0.1);
        opt.use_kernels(kernels);
        let mut runs: Vec<f64> = (0..6)
            .map(|_| {
                set_gradients(&mut model, &grads);
                tch::Cuda::synchronize(0);
                let t = Instant::now();
                let _ = opt.step(&mut model.params, 1e-3);
                tch::Cuda::synchronize(0);
                t.elapsed().as_secs_f64() * 1e3
            })
            .skip(1)
            .collect();
        runs.sort_by(f64::total_cmp);
        (runs[2], opt.kernels())
    };
    let (kernels, libtorch) = (time(true), time(false));
    println!(
        "{}",
        json!({"speed": "adamw step (24 layers, d_model 1024)", "parameters": model.params.numel(),
               "kernels_ms": kernels.0, "kernels_used": kernels.1, "libtorch_ms": libtorch.0})
    );
}

/// Gives every parameter but the last `grads[i]` as its gradient (the last gets none, as a
/// parameter that took no part in a loss).
fn set_gradients(model: &mut ByteGpt, grads: &[Tensor]) {
    model.params.zero_grad();
    let params = &model.params.params;
    let loss = params
        .iter()
        .zip(grads)
        .take(params.len() - 1)
        .map(|(p, g)| (&p.tensor * g).sum(Kind::Float))
        .reduce(|a, b| a + b)
        .expect("the model has more than one parameter");
    loss.backward();
}

/// One step's loss and gradients of a two-layer 1024-wide model, fused and eager.
fn model_check(device: Device) -> bool {
    let config = ModelConfig {
        d_model: 1024,
        n_layers: 2,
        n_heads: 16,
        max_seq_len: 256,
    };
    let model = ByteGpt::new(&config, device, 1);
    let ids = Tensor::randint(256, [8, 256], (Kind::Int64, device));
    let targets = Tensor::randint(256, [8, 256], (Kind::Int64, device));
    compare_step(
        "model step (2 layers, d_model 1024, batch 8 x 256)",
        &model.params,
        |fused| {
            let logits = model.forward_with(&ids, Kind::BFloat16, fused);
            crate::model::cross_entropy_with(&logits, &targets, fused)
        },
    )
}

/// One training step's loss and parameter gradients of a two-layer Llama (width 1024, 16 query
/// and 4 key-value heads, vocabulary 4000) with the worker's kernels against without them.
fn llama_check(device: Device) -> bool {
    let config = crate::model::llama::config::LlamaConfig::parse(
        r#"{"model_type":"llama","vocab_size":4000,"hidden_size":1024,"intermediate_size":2816,
            "num_hidden_layers":2,"num_attention_heads":16,"num_key_value_heads":4,
            "max_position_embeddings":512,"rope_theta":10000.0,"tie_word_embeddings":false}"#,
    )
    .expect("a valid config");
    let model = crate::model::llama::Llama::zeroed(&config, device);
    tch::no_grad(|| {
        let _ = model.params.flat.shallow_clone().normal_(0.0, 0.02);
        for p in &model.params.params {
            if p.name.ends_with("norm.weight") {
                let _ = p.tensor.shallow_clone().fill_(1.0);
            }
        }
    });
    let ids = Tensor::randint(4000, [8, 256], (Kind::Int64, device));
    let targets = Tensor::randint(4000, [8, 256], (Kind::Int64, device));
    compare_step(
        "Llama step (2 layers, width 1024, GQA 16/4, batch 8 x 256)",
        &model.params,
        |fused| model.loss_with(&ids, &targets, Kind::BFloat16, fused),
    )
}

/// One training step with the worker's kernels (`loss(true)`) against without them
/// (`loss(false)`), the gradients of `params` cleared before each: prints the two losses and
/// the largest relative difference of a parameter's gradient as one JSON line named `what`,
/// and says whether they agree (losses within 1e-3, gradients within [`MODEL_TOLERANCE`]).
fn compare_step(what: &str, params: &ParamStore, loss: impl Fn(bool) -> Tensor) -> bool {
    let step = |fused: bool| {
        for p in &params.params {
            p.tensor.shallow_clone().zero_grad();
        }
        let loss = loss(fused);
        loss.backward();
        let grads: Vec<(String, Tensor)> = params
            .params
            .iter()
            .map(|p| (p.name.clone(), p.tensor.grad().copy()))
            .collect();
        (loss.double_value(&[]), grads)
    };
    let (loss_f, grads_f) = step(true);
    let (loss_e, grads_e) = step(false);
    let mut worst = (0.0f64, String::new());
    for ((name, f), (_, e)) in grads_f.iter().zip(&grads_e) {
        let d = (f - e).norm().double_value(&[]) / e.norm().double_value(&[]).max(1e-30);
        if d > worst.0 {
            worst = (d, name.clone());
        }
    }
    let ok = (loss_f - loss_e).abs() <= 1e-3 * loss_e.abs() && worst.0 <= MODEL_TOLERANCE;
    println!(
        "{}",
        json!({"check": what, "loss_fused": loss_f, "loss_eager": loss_e,
               "largest_gradient_difference": worst.0, "in": worst.1, "ok": ok})
    );
    ok
}
