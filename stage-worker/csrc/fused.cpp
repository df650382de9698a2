// The residual add, the LayerNorm and the cast to bf16 of the model's blocks in one kernel,
// forward and backward, with autograd functions around them; also (further down) the linear
// layers' bias gradients, the token + position embedding, the cross-entropy of the logits and
// the AdamW step, so that a new process loads one module of kernels rather than a dozen
// kinds of libtorch's. Called from stage-worker/src/kernels/fused.rs.
//
// libtorch runs `x + y`, `layer_norm(x)` and `.to(bf16)` as three kernels forward and about
// six backward (the cast back, LayerNorm's input and parameter gradients, the sum of the two
// residual gradients, the cast of the branch's gradient), each moving whole activations
// through memory. Here the forward reads x (fp32) and y (bf16) once and writes the new
// residual (fp32), the normalised activation (bf16) and the row statistics; the backward reads
// the activation's gradient (bf16), the saved residual and the residual's own gradient once
// and writes the gradients of x (fp32) and y (bf16), with the parameter gradients summed per
// block and then over blocks. The arithmetic is the eager one (fp32 throughout, the same
// formulas; bf16 rounded to nearest even as c10::BFloat16 does), not bit-identical (sums are
// taken in another order).
//
// The kernels themselves are in kernels.cu; kernel_module.cpp compiles and loads them.
//
// Every entry point returns 0, or 1 with a message in `err` (no exception unwinds into Rust).

#include <ATen/core/Tensor.h>
#include <optional>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/div.h>
#include <ATen/ops/sum.h>
#include <torch/csrc/autograd/custom_function.h>
#include <c10/core/GradMode.h>

#include "kernel_module.h"
#include "kernels_host.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace sw_kernels;

void require(bool ok, const char *what) {
  if (!ok) throw std::invalid_argument(what);
}

void check_operand(const at::Tensor &t, at::ScalarType kind, int64_t numel, const char *what) {
  require(t.is_cuda() && t.is_contiguous() && t.scalar_type() == kind && t.numel() == numel &&
              reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0,
          what);
}

template <typename T> T *ptr(const at::Tensor &t) {
  return t.defined() ? static_cast<T *>(t.data_ptr()) : nullptr;
}

// `t` contiguous, and on CUDA 16-byte aligned (a copy when it is a view that starts elsewhere,
// such as a slice of a larger buffer): what the vector loads of the kernels below need.
at::Tensor aligned(const at::Tensor &t) {
  const at::Tensor c = t.contiguous();
  if (!c.is_cuda() || reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0) return c;
  return c.clone();
}

// The forward pass: {xn, a, mean, rstd} (xn undefined when y is). b undefined: RMSNorm.
std::vector<at::Tensor> ln_forward(const at::Tensor &x, const at::Tensor &y, const at::Tensor &w,
                                const at::Tensor &b, double eps) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  require(C % 128 == 0 && C <= 4096, "the fused LayerNorm takes a width that is a multiple of 128, at most 4096");
  check_operand(x, at::kFloat, N * C, "x must be a contiguous fp32 CUDA tensor");
  if (y.defined()) check_operand(y, at::kBFloat16, N * C, "y must be a contiguous bf16 tensor like x");
  check_operand(w, at::kFloat, C, "the LayerNorm weight must be fp32 of the last dimension's size");
  if (b.defined()) check_operand(b, at::kFloat, C, "the LayerNorm bias must be fp32 of the last dimension's size");
  const Kernels &k = kernels(x.get_device());
  enter(k);
  at::Tensor xn = y.defined() ? at::empty_like(x) : at::Tensor();
  at::Tensor a = at::empty(x.sizes(), x.options().dtype(at::kBFloat16));
  at::Tensor mean = at::empty({N}, x.options());
  at::Tensor rstd = at::empty({N}, x.options());
  const float *px = ptr<float>(x);
  const uint16_t *py = ptr<uint16_t>(y);
  const float *pw = ptr<float>(w), *pb = ptr<float>(b);
  float *pxn = ptr<float>(xn);
  uint16_t *pa = ptr<uint16_t>(a);
  float *pm = ptr<float>(mean), *pr = ptr<float>(rstd);
  int c = static_cast<int>(C);
  float e = static_cast<float>(eps);
  if (N > 0) {
    launch(k.forward, static_cast<unsigned>(N), static_cast<unsigned>(C / 4), 1,
           {&px, &py, &pw, &pb, &pxn, &pa, &pm, &pr, &c, &e});
  }
  return {xn, a, mean, rstd};
}

// The backward pass: {gx, gy, gw, gb} (gy undefined unless wanted; gb undefined for RMSNorm,
// `bias` false).
std::vector<at::Tensor> ln_backward(const at::Tensor &ga_in, const at::Tensor &gres_in,
                                 const at::Tensor &xn, const at::Tensor &mean,
                                 const at::Tensor &rstd, const at::Tensor &w, bool want_gy,
                                 bool bias = true) {
  const int64_t C = xn.size(-1), N = xn.numel() / C;
  const at::Tensor ga = aligned(ga_in.to(at::kBFloat16));
  const at::Tensor gres = gres_in.defined() ? aligned(gres_in.to(at::kFloat)) : at::Tensor();
  check_operand(ga, at::kBFloat16, N * C, "the activation's gradient has the wrong shape");
  if (gres.defined()) check_operand(gres, at::kFloat, N * C, "the residual's gradient has the wrong shape");
  const Kernels &k = kernels(xn.get_device());
  enter(k);
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(N, 4 * k.multiprocessors));
  const int64_t rows = (N + parts - 1) / parts;
  const int64_t blocks = N > 0 ? (N + rows - 1) / rows : 1;
  at::Tensor gx = at::empty_like(xn);
  at::Tensor gy = want_gy ? at::empty(xn.sizes(), xn.options().dtype(at::kBFloat16)) : at::Tensor();
  // Every block writes its whole row of partial sums; with no rows there is one row of zeros.
  at::Tensor pw = N > 0 ? at::empty({blocks, C}, xn.options()) : at::zeros({1, C}, xn.options());
  at::Tensor pb = !bias ? at::Tensor()
                 : N > 0 ? at::empty({blocks, C}, xn.options())
                         : at::zeros({1, C}, xn.options());
  at::Tensor gw = at::empty({C}, xn.options());
  at::Tensor gb = bias ? at::empty({C}, xn.options()) : at::Tensor();
  const uint16_t *p_ga = ptr<uint16_t>(ga);
  const float *p_xn = ptr<float>(xn), *p_mean = ptr<float>(mean), *p_rstd = ptr<float>(rstd);
  const float *p_w = ptr<float>(w), *p_gres = ptr<float>(gres);
  float *p_gx = ptr<float>(gx);
  uint16_t *p_gy = ptr<uint16_t>(gy);
  float *p_pw = ptr<float>(pw), *p_pb = ptr<float>(pb), *p_gw = ptr<float>(gw), *p_gb = ptr<float>(gb);
  int n = static_cast<int>(N), c = static_cast<int>(C), r = static_cast<int>(rows);
  int nparts = static_cast<int>(blocks);
  if (N > 0) {
    launch(k.backward, static_cast<unsigned>(blocks), static_cast<unsigned>(C / 4), 1,
           {&p_ga, &p_xn, &p_mean, &p_rstd, &p_w, &p_gres, &p_gx, &p_gy, &p_pw, &p_pb, &n, &c, &r});
  }
  launch(k.parameters, static_cast<unsigned>(C / 32), 32, 8, {&p_pw, &p_pb, &nparts, &c, &p_gw, &p_gb});
  return {gx, gy, gw, gb};
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// xn = x + y, a = bf16(LayerNorm(xn)): gradients for x, y, w and b.
// No b: RMSNorm (no centring, no bias; no gradient for b).
struct ResidualLayerNorm : public torch::autograd::Function<ResidualLayerNorm> {
  static variable_list forward(AutogradContext *ctx, at::Tensor x, at::Tensor y, at::Tensor w,
                               std::optional<at::Tensor> bias, double eps) {
    const at::Tensor b = bias.value_or(at::Tensor());
    auto out = ln_forward(x.contiguous(), y.contiguous(), w.contiguous(),
                          b.defined() ? b.contiguous() : b, eps);
    ctx->save_for_backward({out[0], out[2], out[3], w});
    ctx->saved_data["bias"] = b.defined();
    return {out[0], out[1]};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    auto g = ln_backward(grads[1], grads[0], s[0], s[1], s[2], s[3].contiguous(), true,
                         ctx->saved_data["bias"].toBool());
    return {g[0], g[1], g[2], g[3], at::Tensor()};
  }
};

// a = bf16(LayerNorm(x)): gradients for x, w and b (b undefined: RMSNorm, as above).
struct LayerNormCast : public torch::autograd::Function<LayerNormCast> {
  static variable_list forward(AutogradContext *ctx, at::Tensor x, at::Tensor w,
                               std::optional<at::Tensor> bias, double eps) {
    const at::Tensor b = bias.value_or(at::Tensor());
    const at::Tensor xc = x.contiguous();
    auto out = ln_forward(xc, at::Tensor(), w.contiguous(), b.defined() ? b.contiguous() : b, eps);
    ctx->save_for_backward({xc, out[2], out[3], w});
    ctx->saved_data["bias"] = b.defined();
    return {out[1]};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    auto g = ln_backward(grads[0], at::Tensor(), s[0], s[1], s[2], s[3].contiguous(), false,
                         ctx->saved_data["bias"].toBool());
    return {g[0], g[2], g[3], at::Tensor()};
  }
};

// The column sums of g ([N, C], bf16) in fp32; with z given, of gz = g * GELU'(z) instead,
// which is returned too ({sums, gz}; gz undefined without z).
std::vector<at::Tensor> column_sums(const at::Tensor &g, const at::Tensor &z) {
  const int64_t C = g.size(-1), N = g.numel() / C;
  require(C % 4 == 0, "column sums take a width that is a multiple of 4");
  check_operand(g, at::kBFloat16, N * C, "the gradient must be a contiguous bf16 CUDA tensor");
  if (z.defined()) check_operand(z, at::kBFloat16, N * C, "the GELU input must be like the gradient");
  const Kernels &k = kernels(g.get_device());
  enter(k);
  const int64_t tiles = (C + 1023) / 1024;
  const int64_t want = std::max<int64_t>(1, (4 * k.multiprocessors + tiles - 1) / tiles);
  const int64_t rows = N > 0 ? (N + std::min(N, want) - 1) / std::min(N, want) : 1;
  const int64_t parts = N > 0 ? (N + rows - 1) / rows : 1;
  at::Tensor partial = N > 0 ? at::empty({parts, C}, g.options().dtype(at::kFloat))
                             : at::zeros({1, C}, g.options().dtype(at::kFloat));
  at::Tensor sums = at::empty({C}, g.options().dtype(at::kFloat));
  at::Tensor gz = z.defined() ? at::empty_like(g) : at::Tensor();
  const uint16_t *p_g = ptr<uint16_t>(g), *p_z = ptr<uint16_t>(z);
  uint16_t *p_gz = ptr<uint16_t>(gz);
  float *p_partial = ptr<float>(partial), *p_sums = ptr<float>(sums);
  int n = static_cast<int>(N), c = static_cast<int>(C), r = static_cast<int>(rows);
  int nparts = static_cast<int>(parts);
  if (N > 0) {
    const unsigned threads = static_cast<unsigned>(std::min<int64_t>(256, (C + 3) / 4));
    const unsigned grid_x = static_cast<unsigned>(tiles), grid_y = static_cast<unsigned>(parts);
    if (z.defined()) {
      std::vector<void *> args = {&p_g, &p_z, &p_gz, &p_partial, &n, &c, &r};
      check(driver().launch(k.gelu_colsum, grid_x, grid_y, 1, threads, 1, 1, 0, nullptr,
                            args.data(), nullptr),
            "cuLaunchKernel");
    } else {
      std::vector<void *> args = {&p_g, &p_partial, &n, &c, &r};
      check(driver().launch(k.colsum, grid_x, grid_y, 1, threads, 1, 1, 0, nullptr, args.data(),
                            nullptr),
            "cuLaunchKernel");
    }
  }
  launch(k.colsum_parts, static_cast<unsigned>((C + 31) / 32), 32, 8,
         {&p_partial, &nparts, &c, &p_sums});
  return {sums, gz};
}

// y = x W^T + b in bf16 (then GELU when asked) from fp32 masters, as autocast computes it;
// the backward pass hands the weight its gradient in fp32 straight from the matrix product
// (no bf16 gradient and cast), and the bias its gradient from one column-sum kernel (fused
// with GELU's backward when there is one), also in fp32. An undefined b means no bias (the
// Llama's projections): no column sums unless GELU's backward needs them.
struct LinearBf16 : public torch::autograd::Function<LinearBf16> {
  static variable_list forward(AutogradContext *ctx, at::Tensor x, at::Tensor w,
                               std::optional<at::Tensor> bias, bool gelu) {
    const at::Tensor b = bias.value_or(at::Tensor());
    const int64_t in = w.size(1), out = w.size(0);
    require(x.scalar_type() == at::kBFloat16 && x.size(-1) == in, "x must be bf16 [.., in]");
    require(w.scalar_type() == at::kFloat &&
                (!b.defined() || (b.scalar_type() == at::kFloat && b.numel() == out)),
            "the weight and bias must be fp32 [out, in] and [out]");
    const at::Tensor x2 = x.reshape({-1, in}).contiguous();
    const at::Tensor wb = w.to(at::kBFloat16);
    const at::Tensor z = b.defined() ? at::addmm(b.to(at::kBFloat16), x2, wb.t()) : at::mm(x2, wb.t());
    const at::Tensor y = gelu ? at::gelu(z) : z;
    ctx->save_for_backward({x2, wb, gelu ? z : at::Tensor()});
    ctx->saved_data["gelu"] = gelu;
    ctx->saved_data["bias"] = b.defined();
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out;
    ctx->saved_data["x_shape"] = x.sizes().vec();
    return {y.view(shape)};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &x2 = s[0], &wb = s[1], &z = s[2];
    const bool gelu = ctx->saved_data["gelu"].toBool();
    const int64_t out = wb.size(0);
    const at::Tensor g = grads[0].to(at::kBFloat16).reshape({-1, out}).contiguous();
    const bool bias = ctx->saved_data["bias"].toBool();
    std::vector<at::Tensor> sums = {at::Tensor(), at::Tensor()};
    if (bias || gelu) sums = column_sums(g, gelu ? z : at::Tensor());
    const at::Tensor gz = gelu ? sums[1] : g;
    const at::Tensor gx = at::mm(gz, wb).view(ctx->saved_data["x_shape"].toIntVector());
    const at::Tensor gw = at::mm(gz.t(), x2, at::kFloat);
    return {gx, gw, bias ? sums[0] : at::Tensor(), at::Tensor()};
  }
};

// 0 into every element of `t` (contiguous fp32) with the module's kernel, so that a zeroed
// buffer costs no libtorch kernel.
void zero(const Kernels &k, const at::Tensor &t) {
  long long n = t.numel();
  if (n == 0) return;
  float *p = ptr<float>(t);
  const long long blocks = std::min<long long>((n + 255) / 256, 8LL * k.multiprocessors);
  launch(k.zero_f32, static_cast<unsigned>(blocks), 256, 1, {&p, &n});
}

void check_ids(const at::Tensor &ids, const at::Tensor &like, const char *what) {
  require(ids.is_cuda() && ids.is_contiguous() && ids.scalar_type() == at::kLong &&
              ids.get_device() == like.get_device(),
          what);
}

// x[b, t, :] = wte[ids[b, t], :] + wpe[t, :] (fp32) for ids [B, T], T at most wpe's rows, and
// the gradients of wte and wpe (wpe's rows from T on get zeros; ids are not differentiable).
struct Embedding : public torch::autograd::Function<Embedding> {
  static variable_list forward(AutogradContext *ctx, at::Tensor wte, at::Tensor wpe,
                               at::Tensor ids_in) {
    const at::Tensor ids = ids_in.contiguous();
    require(ids.dim() == 2, "the ids must be [batch, time]");
    const int64_t B = ids.size(0), T = ids.size(1), C = wte.size(-1), V = wte.size(0);
    require(wte.dim() == 2 && wpe.dim() == 2 && wpe.size(1) == C && T <= wpe.size(0),
            "the embeddings must be [vocab, C] and [positions, C], with at least T positions");
    require(C % 4 == 0 && C <= 4096, "the fused embedding takes a width that is a multiple of 4");
    const at::Tensor e = wte.contiguous(), p = wpe.contiguous();
    check_operand(e, at::kFloat, V * C, "the token embedding must be a contiguous fp32 CUDA tensor");
    check_operand(p, at::kFloat, wpe.size(0) * C, "the position embedding must be fp32 like it");
    check_ids(ids, e, "the ids must be int64 on the embeddings' device");
    const Kernels &k = kernels(e.get_device());
    enter(k);
    at::Tensor x = at::empty({B, T, C}, e.options());
    const long long *p_ids = ptr<long long>(ids);
    const float *p_e = ptr<float>(e), *p_p = ptr<float>(p);
    float *p_x = ptr<float>(x);
    int t = static_cast<int>(T), c = static_cast<int>(C), v = static_cast<int>(V);
    if (B * T > 0) {
      const unsigned threads = static_cast<unsigned>(std::min<int64_t>(256, std::max<int64_t>(32, C / 4)));
      launch(k.embed_fwd, static_cast<unsigned>(B * T), threads, 1, {&p_ids, &p_e, &p_p, &p_x, &t, &c, &v});
    }
    ctx->save_for_backward({ids});
    ctx->saved_data["sizes"] = std::vector<int64_t>{V, wpe.size(0), C};
    return {x};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    const at::Tensor ids = ctx->get_saved_variables()[0];
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    const int64_t V = sizes[0], P = sizes[1], C = sizes[2], B = ids.size(0), T = ids.size(1);
    const at::Tensor g = grads[0].to(at::kFloat).contiguous();
    check_operand(g, at::kFloat, B * T * C, "the embedding's gradient has the wrong shape");
    const Kernels &k = kernels(g.get_device());
    enter(k);
    at::Tensor dwte = at::empty({V, C}, g.options());
    at::Tensor dwpe = at::empty({P, C}, g.options());
    zero(k, dwte);
    zero(k, dwpe);
    const float *p_g = ptr<float>(g);
    const long long *p_ids = ptr<long long>(ids);
    float *p_dwte = ptr<float>(dwte), *p_dwpe = ptr<float>(dwpe);
    int b = static_cast<int>(B), t = static_cast<int>(T), c = static_cast<int>(C),
        v = static_cast<int>(V);
    if (B * T > 0) {
      const unsigned threads = 256;
      const unsigned columns = static_cast<unsigned>((C + threads - 1) / threads);
      std::vector<void *> args = {&p_g, &p_ids, &p_dwte, &p_dwpe, &b, &t, &c, &v};
      check(driver().launch(k.embed_bwd, static_cast<unsigned>(T), columns, 1, threads, 1, 1, 0,
                            nullptr, args.data(), nullptr),
            "cuLaunchKernel");
    }
    return {dwte, dwpe, at::Tensor()};
  }
};

// The blocks of a launch that takes `rows` rows of logits, one warp per row, 8 warps a block.
unsigned xent_blocks(const Kernels &k, int64_t rows) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((rows + 7) / 8, 8LL * k.multiprocessors)));
}

// The mean cross-entropy (fp32 scalar) of bf16 logits [.., 256] against int64 targets of the
// leading shape, over the targets that are neither `ignore` nor outside [0, 256); the
// gradient of the logits in bf16.
struct CrossEntropy : public torch::autograd::Function<CrossEntropy> {
  static variable_list forward(AutogradContext *ctx, at::Tensor logits_in, at::Tensor targets_in,
                               int64_t ignore) {
    require(logits_in.size(-1) == 256, "the fused cross-entropy takes 256 classes");
    const at::Tensor logits = logits_in.reshape({-1, 256}).contiguous();
    const at::Tensor targets = targets_in.reshape({-1}).contiguous();
    const int64_t N = logits.size(0);
    check_operand(logits, at::kBFloat16, N * 256, "the logits must be a contiguous bf16 CUDA tensor");
    check_ids(targets, logits, "the targets must be int64 on the logits' device");
    require(targets.numel() == N, "one target per row of logits");
    const Kernels &k = kernels(logits.get_device());
    enter(k);
    const unsigned blocks = xent_blocks(k, N);
    at::Tensor lse = at::empty({std::max<int64_t>(1, N)}, logits.options().dtype(at::kFloat));
    at::Tensor partial = at::empty({2 * static_cast<int64_t>(blocks)}, lse.options());
    at::Tensor loss = at::empty({}, lse.options());
    at::Tensor count = at::empty({1}, lse.options());
    const uint16_t *p_logits = ptr<uint16_t>(logits);
    const long long *p_targets = ptr<long long>(targets);
    float *p_lse = ptr<float>(lse), *p_partial = ptr<float>(partial);
    float *p_loss = ptr<float>(loss), *p_count = ptr<float>(count);
    long long n = N, ign = ignore;
    launch(k.xent_fwd, blocks, 256, 1, {&p_logits, &p_targets, &p_lse, &p_partial, &n, &ign});
    int parts = static_cast<int>(blocks);
    const float *p_parts = p_partial;
    launch(k.xent_finish, 1, 256, 1, {&p_parts, &parts, &p_loss, &p_count});
    ctx->save_for_backward({logits, targets, lse, count});
    ctx->saved_data["ignore"] = ignore;
    ctx->saved_data["shape"] = logits_in.sizes().vec();
    return {loss};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &logits = s[0], &targets = s[1], &lse = s[2], &count = s[3];
    const at::Tensor g = grads[0].to(at::kFloat).contiguous();
    require(g.numel() == 1 && g.is_cuda(), "the loss's gradient must be one value on the device");
    const Kernels &k = kernels(logits.get_device());
    enter(k);
    const int64_t N = logits.size(0);
    at::Tensor dlogits = at::empty_like(logits);
    const uint16_t *p_logits = ptr<uint16_t>(logits);
    const long long *p_targets = ptr<long long>(targets);
    const float *p_lse = ptr<float>(lse), *p_g = ptr<float>(g), *p_count = ptr<float>(count);
    uint16_t *p_d = ptr<uint16_t>(dlogits);
    long long n = N, ign = ctx->saved_data["ignore"].toInt();
    if (N > 0) {
      launch(k.xent_bwd, xent_blocks(k, N), 256, 1,
             {&p_logits, &p_targets, &p_lse, &p_g, &p_count, &p_d, &n, &ign});
    }
    return {dlogits.view(ctx->saved_data["shape"].toIntVector()), at::Tensor(), at::Tensor()};
  }
};

// ---- Llama: the rotary embedding and SwiGLU, on the GPU's kernels or (CPU tensors) the same
// kernels compiled for the host (kernels_host.cpp) ----

// Blocks of 256 threads for a grid-stride launch over `n` items.
unsigned stride_blocks(const Kernels &k, long long n) {
  return static_cast<unsigned>(std::max<long long>(1, std::min<long long>((n + 255) / 256, 16LL * k.multiprocessors)));
}

void check_bf16(const at::Tensor &t, const at::Tensor &like, const char *what) {
  require(t.is_contiguous() && t.scalar_type() == at::kBFloat16 && t.device() == like.device() &&
              (!t.is_cuda() || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0),
          what);
}

// out = x rotated by the position's angles (see stage_worker_rope), `sign` -1 for the inverse.
at::Tensor rope_apply(const at::Tensor &x, const at::Tensor &cos_t, const at::Tensor &sin_t,
                      int64_t heads, double sign) {
  const int64_t T = cos_t.size(0), half = cos_t.size(1), D = 2 * half;
  require(x.dim() >= 2 && x.size(-2) == T && x.size(-1) == heads * D,
          "the rotary embedding takes x [.., T, heads * head_dim] and tables [T, head_dim / 2]");
  check_bf16(x, x, "x must be a contiguous bf16 tensor");
  for (const at::Tensor *t : {&cos_t, &sin_t}) {
    require(t->is_contiguous() && t->scalar_type() == at::kFloat && t->device() == x.device() &&
                t->sizes() == cos_t.sizes(),
            "the rotary tables must be contiguous fp32 [T, head_dim / 2] on x's device");
  }
  at::Tensor out = at::empty_like(x);
  const uint16_t *px = ptr<uint16_t>(x);
  const float *pc = ptr<float>(cos_t), *ps = ptr<float>(sin_t);
  uint16_t *po = ptr<uint16_t>(out);
  long long rows = x.numel() / (heads * D);
  int t = static_cast<int>(T), h = static_cast<int>(heads), d = static_cast<int>(D);
  float sg = static_cast<float>(sign);
  if (rows == 0) return out;
  if (!x.is_cuda()) {
    sw_host::rope(px, pc, ps, po, rows, t, h, d, sg);
    return out;
  }
  const Kernels &k = kernels(x.get_device());
  enter(k);
  const unsigned threads = static_cast<unsigned>(std::min<int64_t>(1024, (heads * half + 31) / 32 * 32));
  const unsigned blocks = static_cast<unsigned>(std::min<long long>(rows, 1LL << 20));
  launch(k.rope, blocks, threads, 1, {&px, &pc, &ps, &po, &rows, &t, &h, &d, &sg});
  return out;
}

// The rotary embedding of x ([.., T, heads * head_dim], bf16) by tables cos and sin ([T,
// head_dim / 2], fp32), computed in fp32 and rounded once; the gradient rotates back.
struct Rope : public torch::autograd::Function<Rope> {
  static variable_list forward(AutogradContext *ctx, at::Tensor x, at::Tensor cos_t,
                               at::Tensor sin_t, int64_t heads) {
    ctx->save_for_backward({cos_t, sin_t});
    ctx->saved_data["heads"] = heads;
    return {rope_apply(aligned(x), cos_t, sin_t, heads, 1.0)};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const at::Tensor g = aligned(grads[0].to(at::kBFloat16));
    return {rope_apply(g, s[0], s[1], ctx->saved_data["heads"].toInt(), -1.0), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

// silu(gate) * up in bf16 (fp32 arithmetic, one rounding), both gradients from one kernel.
struct SwiGlu : public torch::autograd::Function<SwiGlu> {
  static variable_list forward(AutogradContext *ctx, at::Tensor gate_in, at::Tensor up_in) {
    const at::Tensor gate = aligned(gate_in), up = aligned(up_in);
    check_bf16(gate, gate, "the gate must be a bf16 tensor");
    check_bf16(up, gate, "up must be a bf16 tensor like the gate");
    require(gate.sizes() == up.sizes(), "the gate and up must have one shape");
    at::Tensor out = at::empty_like(gate);
    const uint16_t *pg = ptr<uint16_t>(gate), *pu = ptr<uint16_t>(up);
    uint16_t *po = ptr<uint16_t>(out);
    long long n = gate.numel();
    if (n > 0 && !gate.is_cuda()) {
      sw_host::swiglu_fwd(pg, pu, po, n);
    } else if (n > 0) {
      const Kernels &k = kernels(gate.get_device());
      enter(k);
      launch(k.swiglu_fwd, stride_blocks(k, (n + 3) / 4), 256, 1, {&pg, &pu, &po, &n});
    }
    ctx->save_for_backward({gate, up});
    return {out};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &gate = s[0], &up = s[1];
    const at::Tensor go = aligned(grads[0].to(at::kBFloat16));
    require(go.sizes() == gate.sizes(), "the gradient must have the output's shape");
    at::Tensor d_gate = at::empty_like(gate), d_up = at::empty_like(up);
    const uint16_t *pgo = ptr<uint16_t>(go), *pg = ptr<uint16_t>(gate), *pu = ptr<uint16_t>(up);
    uint16_t *pdg = ptr<uint16_t>(d_gate), *pdu = ptr<uint16_t>(d_up);
    long long n = gate.numel();
    if (n > 0 && !gate.is_cuda()) {
      sw_host::swiglu_bwd(pgo, pg, pu, pdg, pdu, n);
    } else if (n > 0) {
      const Kernels &k = kernels(gate.get_device());
      enter(k);
      launch(k.swiglu_bwd, stride_blocks(k, (n + 3) / 4), 256, 1, {&pgo, &pg, &pu, &pdg, &pdu, &n});
    }
    return {d_gate, d_up};
  }
};

// The mean cross-entropy (fp32 scalar) of bf16 logits [.., V] (V a multiple of 4) against
// int64 targets of the leading shape, over the targets that are neither `ignore` nor outside
// [0, V): one kernel reads each row once (its log-sum-exp and loss), libtorch sums the rows;
// the backward pass writes the logits' gradient in bf16 in one kernel. No fp32 copy of the
// logits is made either way.
struct RowsCrossEntropy : public torch::autograd::Function<RowsCrossEntropy> {
  static variable_list forward(AutogradContext *ctx, at::Tensor logits_in, at::Tensor targets_in,
                               int64_t ignore) {
    const int64_t V = logits_in.size(-1);
    require(V % 4 == 0 && V <= (1LL << 30), "the cross-entropy kernel takes a vocabulary that is a multiple of 4");
    const at::Tensor logits = aligned(logits_in.reshape({-1, V}));
    const at::Tensor targets = targets_in.reshape({-1}).contiguous();
    const int64_t N = logits.size(0);
    check_bf16(logits, logits, "the logits must be a bf16 tensor");
    require(targets.scalar_type() == at::kLong && targets.device() == logits.device() &&
                targets.numel() == N,
            "one int64 target per row of logits, on their device");
    at::Tensor lse = at::empty({N}, logits.options().dtype(at::kFloat));
    at::Tensor rows = at::empty_like(lse), counted = at::empty_like(lse);
    const uint16_t *pl = ptr<uint16_t>(logits);
    const long long *pt = ptr<long long>(targets);
    float *p_lse = ptr<float>(lse), *p_rows = ptr<float>(rows), *p_cnt = ptr<float>(counted);
    int v = static_cast<int>(V);
    long long ign = ignore;
    if (N > 0 && !logits.is_cuda()) {
      sw_host::xent_rows_fwd(pl, pt, p_lse, p_rows, p_cnt, N, v, ign);
    } else if (N > 0) {
      const Kernels &k = kernels(logits.get_device());
      enter(k);
      launch(k.xent_rows_fwd, static_cast<unsigned>(N), 256, 1, {&pl, &pt, &p_lse, &p_rows, &p_cnt, &v, &ign});
    }
    const at::Tensor count = at::sum(counted);
    const at::Tensor loss = at::div(at::sum(rows), count);
    ctx->save_for_backward({logits, targets, lse, count});
    ctx->saved_data["ignore"] = ignore;
    ctx->saved_data["shape"] = logits_in.sizes().vec();
    return {loss};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &logits = s[0], &targets = s[1], &lse = s[2], &count = s[3];
    const at::Tensor g = grads[0].to(at::kFloat).contiguous();
    require(g.numel() == 1 && g.device() == logits.device(), "the loss's gradient must be one value on the logits' device");
    at::Tensor d = at::empty_like(logits);
    const int64_t N = logits.size(0);
    const uint16_t *pl = ptr<uint16_t>(logits);
    const long long *pt = ptr<long long>(targets);
    const float *p_lse = ptr<float>(lse), *pg = ptr<float>(g), *pc = ptr<float>(count);
    uint16_t *pd = ptr<uint16_t>(d);
    int v = static_cast<int>(logits.size(1));
    long long ign = ctx->saved_data["ignore"].toInt();
    if (N > 0 && !logits.is_cuda()) {
      sw_host::xent_rows_bwd(pl, pt, p_lse, pg, pc, pd, N, v, ign);
    } else if (N > 0) {
      const Kernels &k = kernels(logits.get_device());
      enter(k);
      launch(k.xent_rows_bwd, static_cast<unsigned>(N), 256, 1, {&pl, &pt, &p_lse, &pg, &pc, &pd, &v, &ign});
    }
    return {d.view(ctx->saved_data["shape"].toIntVector()), at::Tensor(), at::Tensor()};
  }
};

// The host's copy of the kernels' OptEntry and OptTable (same layout, checked below).
constexpr int kOptTensors = 64;
struct OptEntry {
  const float *grad;
  long long offset;
  long long len;
  float decay;
  unsigned first_block;
};
struct OptTable {
  OptEntry e[kOptTensors];
  int count;
  unsigned blocks;
};
static_assert(sizeof(OptEntry) == 32 && sizeof(OptTable) == 2056,
              "OptTable must match the kernels' layout");

constexpr unsigned kOptThreads = 256;
// Each parameter gets one block per 8 elements a thread, at most this many (a block then
// strides over its share): enough blocks to fill the GPU, few partial sums for the norm.
constexpr long long kOptMaxBlocks = 512;

// The launches of one optimizer step: tables of at most kOptTensors parameters each, every
// parameter with its own range of blocks.
std::vector<OptTable> opt_tables(const std::vector<OptEntry> &entries) {
  std::vector<OptTable> tables;
  for (const OptEntry &e : entries) {
    if (tables.empty() || tables.back().count == kOptTensors) {
      tables.emplace_back();
      std::memset(&tables.back(), 0, sizeof(OptTable));
    }
    OptTable &t = tables.back();
    const long long per_block = static_cast<long long>(kOptThreads) * 8;
    const long long blocks = std::min(kOptMaxBlocks, (e.len + per_block - 1) / per_block);
    t.e[t.count] = e;
    t.e[t.count].first_block = t.blocks;
    t.count += 1;
    t.blocks += static_cast<unsigned>(blocks);
  }
  return tables;
}

// Every check of the optimizer's operands, before anything runs; throws std::invalid_argument.
void check_optimizer_state(const at::Tensor &flat, const at::Tensor &m, const at::Tensor &v,
                           const at::Tensor &step) {
  require(flat.is_cuda() && flat.is_contiguous() && flat.scalar_type() == at::kFloat,
          "the flat parameters must be a contiguous fp32 CUDA tensor");
  for (const at::Tensor *t : {&m, &v}) {
    require(t->is_cuda() && t->is_contiguous() && t->scalar_type() == at::kFloat &&
                t->numel() == flat.numel() && t->get_device() == flat.get_device(),
            "the moments must be contiguous fp32 tensors like the flat parameters");
  }
  require(step.is_cuda() && step.is_contiguous() && step.scalar_type() == at::kFloat &&
              step.numel() == 1 && step.get_device() == flat.get_device(),
          "the step counter must be one fp32 on the parameters' device");
}

// The table entries of the parameters, with their gradients made contiguous fp32 where
// autograd left them otherwise (kept alive in `held` until the launches are queued).
std::vector<OptEntry> opt_entries(const at::Tensor *const *leaves, const int64_t *offsets,
                                  size_t n, const at::Tensor &flat, int64_t decay_len,
                                  double weight_decay, std::vector<at::Tensor> &held) {
  std::vector<OptEntry> entries;
  for (size_t i = 0; i < n; ++i) {
    const int64_t len = leaves[i]->numel();
    require(offsets[i] >= 0 && offsets[i] + len <= flat.numel(),
            "a parameter lies outside the flat buffer");
    if (len == 0) continue;
    at::Tensor g = leaves[i]->grad();
    const float *gp = nullptr;
    if (g.defined()) {
      require(g.is_cuda() && g.get_device() == flat.get_device() && g.numel() == len &&
                  g.scalar_type() == at::kFloat,
              "a gradient is not fp32 on the parameters' device, or not of its parameter's size");
      held.push_back(g.contiguous());
      gp = ptr<float>(held.back());
    }
    const float decay = offsets[i] < decay_len ? static_cast<float>(weight_decay) : 0.f;
    entries.push_back({gp, offsets[i], len, decay, 0});
  }
  return entries;
}

// The optimizer step's launches: the squares' partial sums, the norm, clipping scale, step
// and bias corrections, then AdamW. Returns the norm before clipping (a device scalar).
at::Tensor optimizer_launches(const std::vector<OptTable> &tables, const at::Tensor &flat,
                              const at::Tensor &m, const at::Tensor &v, const at::Tensor &step,
                              double lr, double beta1, double beta2, double eps,
                              double clip_norm) {
  const Kernels &k = kernels(flat.get_device());
  enter(k);
  int64_t parts = 0;
  for (const OptTable &t : tables) parts += t.blocks;
  at::Tensor partial = at::empty({std::max<int64_t>(1, parts)}, flat.options());
  at::Tensor norm = at::empty({}, flat.options());
  at::Tensor opt = at::empty({3}, flat.options());
  float *p_partial = ptr<float>(partial);
  for (const OptTable &t : tables) {
    OptTable table = t;
    float *out = p_partial;
    launch(k.opt_sumsq, t.blocks, kOptThreads, 1, {&table, &out});
    p_partial += t.blocks;
  }
  const float *p_parts = ptr<float>(partial);
  int nparts = static_cast<int>(parts);
  float inv_clip = static_cast<float>(1.0 / clip_norm);
  float *p_norm = ptr<float>(norm), *p_step = ptr<float>(step), *p_opt = ptr<float>(opt);
  // 256 threads, not 1024: the double-precision pow may take more registers than a block of
  // 1024 threads may have each.
  launch(k.opt_finish, 1, 256, 1,
         {&p_parts, &nparts, &inv_clip, &beta1, &beta2, &p_norm, &p_step, &p_opt});
  float *p_flat = ptr<float>(flat), *p_m = ptr<float>(m), *p_v = ptr<float>(v);
  const float *p_opt_in = p_opt;
  float f_lr = static_cast<float>(lr), b1 = static_cast<float>(beta1),
        b2 = static_cast<float>(beta2), e = static_cast<float>(eps);
  for (const OptTable &t : tables) {
    OptTable table = t;
    launch(k.opt_adamw, t.blocks, kOptThreads, 1,
           {&table, &p_flat, &p_m, &p_v, &p_opt_in, &f_lr, &b1, &b2, &e});
  }
  return norm;
}

int fail(const std::exception &e, char *err, size_t err_len) {
  std::snprintf(err, err_len, "%s", e.what());
  return 1;
}

}  // namespace

// Compiles the kernels for sm_<arch> without loading them (no GPU needed); stores the cubin's
// size in *bytes. A check that the source builds with this NVRTC.
extern "C" int stage_worker_fused_compile(int arch, size_t *bytes, char *err, size_t err_len) {
  try {
    *bytes = compile(arch).size();
    return 0;
  } catch (const std::exception &e) {
    return fail(e, err, err_len);
  }
}

// Compiles (or reads from the cache) and loads the kernels for CUDA device `ordinal`, whose
// context must be current on this thread, unless that was done: 0 when they can run; *cached
// says whether the cubin came from the cache (see cache_dir) rather than from NVRTC.
extern "C" int stage_worker_fused_load(int ordinal, bool *cached, char *err, size_t err_len) {
  try {
    kernels(ordinal);
    *cached = kernels_from_cache();
    return 0;
  } catch (const std::exception &e) {
    return fail(e, err, err_len);
  }
}

// (*xn_out, *a_out) = (x + y, bf16(LayerNorm(x + y) * w + b)), recorded for autograd. With y
// null: *a_out = bf16(LayerNorm(x) * w + b) and *xn_out is left alone. With b null, RMSNorm
// (no centring, no bias) in place of LayerNorm. New handles the caller owns.
extern "C" int stage_worker_residual_layer_norm(const at::Tensor *x, const at::Tensor *y,
                                                const at::Tensor *w, const at::Tensor *b,
                                                double eps, at::Tensor **xn_out,
                                                at::Tensor **a_out, char *err, size_t err_len) {
  try {
    // No bias (RMSNorm) is an empty optional, not an undefined tensor: autograd reads the
    // device of every tensor argument of a custom function, and an undefined one has none.
    const std::optional<at::Tensor> bias = b == nullptr ? std::nullopt : std::optional<at::Tensor>(*b);
    if (y != nullptr) {
      auto out = ResidualLayerNorm::apply(*x, *y, *w, bias, eps);
      *xn_out = new at::Tensor(out[0]);
      *a_out = new at::Tensor(out[1]);
    } else {
      auto out = LayerNormCast::apply(*x, *w, bias, eps);
      *a_out = new at::Tensor(out[0]);
    }
    return 0;
  } catch (const std::exception &e) {
    return fail(e, err, err_len);
  }
}

// *y_out = x W^T + b (bf16, GELU applied when `gelu`; b null: no bias), recorded for autograd
// with the gradients described at LinearBf16. A new handle the caller owns.
extern "C" int stage_worker_linear_bf16(const at::Tensor *x, const at::Tensor *w,
                                        const at::Tensor *b, bool gelu, at::Tensor **y_out,
                                        char *err, size_t err_len) {
  try {
    const std::optional<at::Tensor> bias = b == nullptr ? std::nullopt : std::optional<at::Tensor>(*b);
    auto out = LinearBf16::apply(*x, *w, bias, gelu);
    *y_out = new at::Tensor(out[0]);
    return 0;
  } catch (const std::exception &e) {
    return fail(e, err, err_len);
  }
}

// One AdamW step with the module's kernels, as stage_worker_adamw_lists (fused_adamw.cpp) takes
// it with libtorch's: leaves[i] is parameter i, at offsets[i] in `flat` (decayed by
// `weight_decay` when below `decay_len`), its gradient as autograd left it (none: zeros). The
// global gradient norm clips the gradients to `clip_norm`, the fp32 counter `step` (on the
// device) advances by one and gives the bias corrections, and every gradient is dropped
// afterwards. Nothing is read back to the host. Returns 0 with *norm_out a new handle (the
// norm before clipping, a device fp32 scalar); 1 when the operands were refused before
// anything ran (the caller may take another path); 2 when a launch failed part-way.
extern "C" int stage_worker_fused_optimizer_step(
    const at::Tensor *const *leaves, const int64_t *offsets, size_t n, const at::Tensor *flat,
    const at::Tensor *exp_avg, const at::Tensor *exp_avg_sq, int64_t decay_len,
    const at::Tensor *step, double lr, double beta1, double beta2, double weight_decay,
    double eps, double clip_norm, at::Tensor **norm_out, char *err, size_t err_len) {
  std::vector<at::Tensor> held;
  std::vector<OptTable> tables;
  try {
    c10::NoGradGuard no_grad;
    require(clip_norm > 0.0, "the clipping norm must be positive");
    check_optimizer_state(*flat, *exp_avg, *exp_avg_sq, *step);
    tables = opt_tables(opt_entries(leaves, offsets, n, *flat, decay_len, weight_decay, held));
    kernels(flat->get_device());
  } catch (const std::exception &e) {
    fail(e, err, err_len);
    return 1;
  }
  try {
    c10::NoGradGuard no_grad;
    at::Tensor norm = optimizer_launches(tables, *flat, *exp_avg, *exp_avg_sq, *step, lr, beta1,
                                         beta2, eps, clip_norm);
    held.clear();
    for (size_t i = 0; i < n; ++i) leaves[i]->mutable_grad().reset();
    *norm_out = new at::Tensor(norm);
    return 0;
  } catch (const std::exception &e) {
    fail(e, err, err_len);
    return 2;
  }
}

// *x_out = wte[ids] + wpe[:T] (fp32 [B, T, C]), recorded for autograd as Embedding describes.
// A new handle the caller owns.
extern "C" int stage_worker_embedding(const at::Tensor *wte, const at::Tensor *wpe,
                                      const at::Tensor *ids, at::Tensor **x_out, char *err,
                                      size_t err_len) {
  try {
    auto out = Embedding::apply(*wte, *wpe, *ids);
    *x_out = new at::Tensor(out[0]);
    return 0;
  } catch (const std::exception &e) {
    return fail(e, err, err_len);
  }
}

// *loss_out = the mean cross-entropy of bf16 logits [.., 256] against targets, ignoring
// `ignore`, recorded for autograd as CrossEntropy describes. A new handle the caller owns.
extern "C" int stage_worker_cross_entropy(const at::Tensor *logits, const at::Tensor *targets,
                                          int64_t ignore, at::Tensor **loss_out, char *err,
                                          size_t err_len) {
  try {
    auto out = CrossEntropy::apply(*logits, *targets, ignore);
    *loss_out = new at::Tensor(out[0]);
    return 0;
  } catch (const std::exception &e) {
    return fail(e, err, err_len);
  }
}

// *out = the rotary embedding of x by cos and sin, recorded for autograd as Rope describes
// (CUDA or CPU tensors). A new handle the caller owns.
extern "C" int stage_worker_llama_rope(const at::Tensor *x, const at::Tensor *cos_t,
                                       const at::Tensor *sin_t, int64_t heads, at::Tensor **out,
                                       char *err, size_t err_len) {
  try {
    auto r = Rope::apply(*x, *cos_t, *sin_t, heads);
    *out = new at::Tensor(r[0]);
    return 0;
  } catch (const std::exception &e) {
    return fail(e, err, err_len);
  }
}

// *out = silu(gate) * up, recorded for autograd as SwiGlu describes (CUDA or CPU tensors). A
// new handle the caller owns.
extern "C" int stage_worker_llama_swiglu(const at::Tensor *gate, const at::Tensor *up,
                                         at::Tensor **out, char *err, size_t err_len) {
  try {
    auto r = SwiGlu::apply(*gate, *up);
    *out = new at::Tensor(r[0]);
    return 0;
  } catch (const std::exception &e) {
    return fail(e, err, err_len);
  }
}

// *loss_out = the mean cross-entropy of bf16 logits [.., V] against targets, ignoring
// `ignore`, recorded for autograd as RowsCrossEntropy describes (CUDA or CPU tensors). A new
// handle the caller owns.
extern "C" int stage_worker_llama_cross_entropy(const at::Tensor *logits,
                                                const at::Tensor *targets, int64_t ignore,
                                                at::Tensor **loss_out, char *err,
                                                size_t err_len) {
  try {
    auto out = RowsCrossEntropy::apply(*logits, *targets, ignore);
    *loss_out = new at::Tensor(out[0]);
    return 0;
  } catch (const std::exception &e) {
    return fail(e, err, err_len);
  }
}
