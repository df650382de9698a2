// The residual add, the LayerNorm and the cast to bf16 of the model's blocks in one kernel,
// forward and backward, with autograd functions around them; also (further down) the linear
// layers' bias gradients, the token + position embedding, the cross-entropy of the logits and
// the AdamW step, so that a new process loads one module of kernels rather than a dozen
// kinds of libtorch's. Called from stage-worker/src/fused.rs.
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
// The kernels are CUDA C compiled at run time by NVRTC for the device's own architecture (the
// wheel's libnvrtc, found next to libtorch) and launched through the driver API, both reached
// by dlopen: nothing here needs the CUDA toolkit at build time. They run on the legacy default
// stream, which is libtorch's default stream; the worker never switches streams.
//
// Every entry point returns 0, or 1 with a message in `err` (no exception unwinds into Rust).
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>
#include <c10/core/GradMode.h>

#include <dirent.h>
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

const char *const kSource = R"CUDA(
typedef unsigned short bf16_t;

__device__ __forceinline__ float bf2f(unsigned bits) { return __uint_as_float(bits << 16); }

// Round to nearest even, as c10::BFloat16 does; NaN stays a quiet NaN.
__device__ __forceinline__ unsigned f2bf(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

__device__ __forceinline__ void load_bf16x4(const bf16_t *p, float v[4]) {
  const uint2 u = *reinterpret_cast<const uint2 *>(p);
  v[0] = bf2f(u.x & 0xffffu);
  v[1] = bf2f(u.x >> 16);
  v[2] = bf2f(u.y & 0xffffu);
  v[3] = bf2f(u.y >> 16);
}

__device__ __forceinline__ void store_bf16x4(bf16_t *p, const float v[4]) {
  uint2 u;
  u.x = f2bf(v[0]) | (f2bf(v[1]) << 16);
  u.y = f2bf(v[2]) | (f2bf(v[3]) << 16);
  *reinterpret_cast<uint2 *>(p) = u;
}

__device__ __forceinline__ void load_f32x4(const float *p, float v[4]) {
  const float4 f = *reinterpret_cast<const float4 *>(p);
  v[0] = f.x;
  v[1] = f.y;
  v[2] = f.z;
  v[3] = f.w;
}

__device__ __forceinline__ void store_f32x4(float *p, const float v[4]) {
  *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
}

// The sum of `v` over the block, in every thread. blockDim.x is a multiple of 32.
__device__ __forceinline__ float2 block_sum2(float2 v, float2 *shared) {
  for (int o = 16; o > 0; o >>= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // the previous use of `shared` is over
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? shared[lane] : make_float2(0.f, 0.f);
  for (int o = 16; o > 0; o >>= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
  }
  return v;
}

// One block per row of C = 4 * blockDim.x values. xn = x + y (when y is given, else x is
// normalised as it is); a = bf16(LayerNorm(xn) * w + b); the row's mean and 1/std.
extern "C" __global__ void stage_worker_ln_fwd(const float *__restrict__ x,
                                               const bf16_t *__restrict__ y,
                                               const float *__restrict__ w,
                                               const float *__restrict__ b,
                                               float *__restrict__ xn, bf16_t *__restrict__ a,
                                               float *__restrict__ mean_out,
                                               float *__restrict__ rstd_out, int C, float eps) {
  __shared__ float2 red[32];
  const long long at = (long long)blockIdx.x * C + threadIdx.x * 4;
  float v[4];
  load_f32x4(x + at, v);
  if (y != nullptr) {
    float u[4];
    load_bf16x4(y + at, u);
    for (int k = 0; k < 4; ++k) v[k] += u[k];
    store_f32x4(xn + at, v);
  }
  const float mean = block_sum2(make_float2(v[0] + v[1] + v[2] + v[3], 0.f), red).x / C;
  float d[4], q = 0.f;
  for (int k = 0; k < 4; ++k) {
    d[k] = v[k] - mean;
    q += d[k] * d[k];
  }
  const float rstd = rsqrtf(block_sum2(make_float2(q, 0.f), red).x / C + eps);
  float wv[4], bv[4], o[4];
  load_f32x4(w + threadIdx.x * 4, wv);
  load_f32x4(b + threadIdx.x * 4, bv);
  for (int k = 0; k < 4; ++k) o[k] = d[k] * rstd * wv[k] + bv[k];
  store_bf16x4(a + at, o);
  if (threadIdx.x == 0) {
    mean_out[blockIdx.x] = mean;
    rstd_out[blockIdx.x] = rstd;
  }
}

// Rows [blockIdx.x * rows, ...) of the backward pass. ga: the gradient of a (bf16); xn: the
// normalised input (fp32); gres: the gradient of xn from the residual stream, or null.
// gx = LayerNorm's input gradient + gres (fp32); gy = bf16(gx), unless null. The block's
// partial sums of ga * xhat and ga per column go to pw and pb (row blockIdx.x).
extern "C" __global__ void stage_worker_ln_bwd(
    const bf16_t *__restrict__ ga, const float *__restrict__ xn, const float *__restrict__ mean,
    const float *__restrict__ rstd, const float *__restrict__ w, const float *__restrict__ gres,
    float *__restrict__ gx, bf16_t *__restrict__ gy, float *__restrict__ pw,
    float *__restrict__ pb, int N, int C, int rows) {
  __shared__ float2 red[32];
  const int c = threadIdx.x * 4;
  float wv[4], accw[4] = {0.f, 0.f, 0.f, 0.f}, accb[4] = {0.f, 0.f, 0.f, 0.f};
  load_f32x4(w + c, wv);
  const int first = blockIdx.x * rows;
  const int end = min(N, first + rows);
  for (int row = first; row < end; ++row) {
    const long long at = (long long)row * C + c;
    float g[4], xv[4], xh[4], gw[4];
    load_bf16x4(ga + at, g);
    load_f32x4(xn + at, xv);
    const float m = mean[row], rs = rstd[row];
    float s1 = 0.f, s2 = 0.f;
    for (int k = 0; k < 4; ++k) {
      xh[k] = (xv[k] - m) * rs;
      gw[k] = g[k] * wv[k];
      accw[k] += g[k] * xh[k];
      accb[k] += g[k];
      s1 += gw[k];
      s2 += gw[k] * xh[k];
    }
    const float2 s = block_sum2(make_float2(s1, s2), red);
    const float mg = s.x / C, mgx = s.y / C;
    float dx[4];
    for (int k = 0; k < 4; ++k) dx[k] = rs * (gw[k] - mg - xh[k] * mgx);
    if (gres != nullptr) {
      float r[4];
      load_f32x4(gres + at, r);
      for (int k = 0; k < 4; ++k) dx[k] += r[k];
    }
    store_f32x4(gx + at, dx);
    if (gy != nullptr) store_bf16x4(gy + at, dx);
  }
  store_f32x4(pw + (long long)blockIdx.x * C + c, accw);
  store_f32x4(pb + (long long)blockIdx.x * C + c, accb);
}

// dw, db = the column sums of pw, pb ([parts, C]). Blocks of 32 x 8 threads, C / 32 blocks.
extern "C" __global__ void stage_worker_ln_bwd_params(const float *__restrict__ pw,
                                                      const float *__restrict__ pb, int parts,
                                                      int C, float *__restrict__ dw,
                                                      float *__restrict__ db) {
  __shared__ float sw[8][33], sb[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float aw = 0.f, ab = 0.f;
  for (int p = threadIdx.y; p < parts; p += 8) {
    aw += pw[(long long)p * C + col];
    ab += pb[(long long)p * C + col];
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0) {
    for (int k = 1; k < 8; ++k) {
      aw += sw[k][threadIdx.x];
      ab += sb[k][threadIdx.x];
    }
    dw[col] = aw;
    db[col] = ab;
  }
}

// Partial column sums of g ([N, C], bf16, C a multiple of 4): columns blockIdx.x * 1024 +
// 4 * threadIdx.x .. + 3 over rows [blockIdx.y * rows, ...), into row blockIdx.y of partial.
extern "C" __global__ void stage_worker_colsum_bf16(const bf16_t *__restrict__ g,
                                                   float *__restrict__ partial, int N, int C,
                                                   int rows) {
  const int c = blockIdx.x * 1024 + threadIdx.x * 4;
  if (c >= C) return;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const int first = blockIdx.y * rows, end = min(N, first + rows);
  for (int r = first; r < end; ++r) {
    float v[4];
    load_bf16x4(g + (long long)r * C + c, v);
    for (int k = 0; k < 4; ++k) acc[k] += v[k];
  }
  store_f32x4(partial + (long long)blockIdx.y * C + c, acc);
}

// gz = bf16(gh * GELU'(z)) (the exact, erf form, as libtorch computes it in fp32), with the
// partial column sums of gz as stage_worker_colsum_bf16 takes them.
extern "C" __global__ void stage_worker_gelu_bwd_colsum(const bf16_t *__restrict__ gh,
                                                       const bf16_t *__restrict__ z,
                                                       bf16_t *__restrict__ gz,
                                                       float *__restrict__ partial, int N,
                                                       int C, int rows) {
  const int c = blockIdx.x * 1024 + threadIdx.x * 4;
  if (c >= C) return;
  const float kAlpha = 0.70710678118654752440f;        // 1 / sqrt(2)
  const float kBeta = 0.39894228040143267794f;         // 1 / sqrt(2 pi)
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const int first = blockIdx.y * rows, end = min(N, first + rows);
  for (int r = first; r < end; ++r) {
    const long long at = (long long)r * C + c;
    float g[4], x[4], d[4];
    load_bf16x4(gh + at, g);
    load_bf16x4(z + at, x);
    for (int k = 0; k < 4; ++k) {
      const float cdf = 0.5f * (1.f + erff(x[k] * kAlpha));
      const float pdf = expf(-0.5f * x[k] * x[k]) * kBeta;
      d[k] = g[k] * (cdf + x[k] * pdf);
    }
    store_bf16x4(gz + at, d);
    for (int k = 0; k < 4; ++k) acc[k] += bf2f(f2bf(d[k]));
  }
  store_f32x4(partial + (long long)blockIdx.y * C + c, acc);
}

// out = the column sums of partial ([parts, C]). Blocks of 32 x 8 threads, ceil(C / 32) blocks.
extern "C" __global__ void stage_worker_colsum_parts(const float *__restrict__ partial,
                                                    int parts, int C, float *__restrict__ out) {
  __shared__ float s[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float a = 0.f;
  if (col < C) {
    for (int p = threadIdx.y; p < parts; p += 8) a += partial[(long long)p * C + col];
  }
  s[threadIdx.y][threadIdx.x] = a;
  __syncthreads();
  if (threadIdx.y == 0 && col < C) {
    for (int k = 1; k < 8; ++k) a += s[k][threadIdx.x];
    out[col] = a;
  }
}
// ---- AdamW over the parameters' own gradients (see stage_worker_fused_optimizer_step) ----

// One parameter of an optimizer launch: its gradient (null: none, taken as zeros), where it
// lies in the flat parameter and moment buffers, its length, its weight decay, and the first
// block of the launch that works on it (blocks first_block .. the next entry's first_block).
struct OptEntry {
  const float *grad;
  long long offset;
  long long len;
  float decay;
  unsigned first_block;
};

// The parameters of one launch, passed by value as a kernel parameter (2056 bytes, under the
// 4 KiB limit); longer lists take several launches.
#define SW_OPT_TENSORS 64
struct OptTable {
  OptEntry e[SW_OPT_TENSORS];
  int count;
  unsigned blocks;
};
static_assert(sizeof(OptEntry) == 32, "the host lays OptEntry out the same way");
static_assert(sizeof(OptTable) == 2056, "the host lays OptTable out the same way");

// The entry this block works on: the last one whose first_block is at most blockIdx.x.
__device__ __forceinline__ int opt_entry(const OptTable &t) {
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (t.e[mid].first_block <= blockIdx.x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// How many blocks work on entry i.
__device__ __forceinline__ long long opt_blocks(const OptTable &t, int i) {
  const unsigned end = i + 1 < t.count ? t.e[i + 1].first_block : t.blocks;
  return (long long)(end - t.e[i].first_block);
}

// partial[blockIdx.x] = the sum of squares of the block's share of its entry's gradient.
extern "C" __global__ void stage_worker_opt_sumsq(const OptTable t, float *__restrict__ partial) {
  __shared__ float2 red[32];
  const int i = opt_entry(t);
  const float *g = t.e[i].grad;
  const long long len = t.e[i].len;
  const long long stride = opt_blocks(t, i) * blockDim.x;
  float s = 0.f;
  if (g != nullptr) {
    for (long long k = (long long)(blockIdx.x - t.e[i].first_block) * blockDim.x + threadIdx.x;
         k < len; k += stride) {
      const float v = g[k];
      s += v * v;
    }
  }
  s = block_sum2(make_float2(s, 0.f), red).x;
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block (blockDim.x a multiple of 32): norm = sqrt(sum of partial), the clipping scale
// max((norm + 1e-6) / clip, 1) into opt[0], the step counter advanced by one, and the bias
// corrections of that step, 1 - beta1^t and sqrt(1 - beta2^t), into opt[1] and opt[2].
extern "C" __global__ void stage_worker_opt_finish(const float *__restrict__ partial, int parts,
                                                   float inv_clip, double beta1, double beta2,
                                                   float *__restrict__ norm,
                                                   float *__restrict__ step,
                                                   float *__restrict__ opt) {
  __shared__ double red[32];
  double s = 0.0;
  for (int k = threadIdx.x; k < parts; k += blockDim.x) s += (double)partial[k];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < (int)(blockDim.x >> 5) ? red[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) {
      const float n = (float)sqrt(s);
      *norm = n;
      opt[0] = fmaxf((n + 1e-6f) * inv_clip, 1.f);
      const float t = *step + 1.f;
      *step = t;
      opt[1] = (float)(1.0 - pow(beta1, (double)t));
      opt[2] = (float)sqrt(1.0 - pow(beta2, (double)t));
    }
  }
}

// AdamW (decoupled weight decay) over each entry's slice of the flat buffers, with the
// gradient divided by the clipping scale opt[0] and the bias corrections opt[1], opt[2], as
// torch's fused AdamW computes it in fp32.
extern "C" __global__ void stage_worker_opt_adamw(const OptTable t, float *__restrict__ param,
                                                  float *__restrict__ exp_avg,
                                                  float *__restrict__ exp_avg_sq,
                                                  const float *__restrict__ opt, float lr,
                                                  float beta1, float beta2, float eps) {
  const int i = opt_entry(t);
  const float *g = t.e[i].grad;
  const long long len = t.e[i].len, offset = t.e[i].offset;
  const float lr_decay = lr * t.e[i].decay;
  const long long stride = opt_blocks(t, i) * blockDim.x;
  const float scale = opt[0], step_size = lr / opt[1], bc2_sqrt = opt[2];
  for (long long k = (long long)(blockIdx.x - t.e[i].first_block) * blockDim.x + threadIdx.x;
       k < len; k += stride) {
    const long long at = offset + k;
    const float gk = g != nullptr ? g[k] / scale : 0.f;
    float p = param[at];
    p -= lr_decay * p;
    const float m = beta1 * exp_avg[at] + (1.f - beta1) * gk;
    const float v = beta2 * exp_avg_sq[at] + (1.f - beta2) * gk * gk;
    exp_avg[at] = m;
    exp_avg_sq[at] = v;
    p -= step_size * m / (sqrtf(v) / bc2_sqrt + eps);
    param[at] = p;
  }
}
// ---- Token and position embedding ----

// out[0 .. n) = 0 (fp32), grid-stride.
extern "C" __global__ void stage_worker_zero_f32(float *__restrict__ out, long long n) {
  for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n;
       k += (long long)gridDim.x * blockDim.x) {
    out[k] = 0.f;
  }
}

// x[r, :] = wte[ids[r], :] + wpe[r % T, :] for the rows r of ids ([B, T] flattened), C a
// multiple of 4, one block per row. An id outside [0, V) takes a zero token embedding (libtorch
// would stop with a device-side assertion; the model's ids are bytes).
extern "C" __global__ void stage_worker_embed_fwd(const long long *__restrict__ ids,
                                                  const float *__restrict__ wte,
                                                  const float *__restrict__ wpe,
                                                  float *__restrict__ x, int T, int C, int V) {
  const long long r = blockIdx.x;
  const long long id = ids[r];
  const bool known = id >= 0 && id < V;
  const long long t = r % T;
  for (int c = threadIdx.x * 4; c < C; c += blockDim.x * 4) {
    float e[4] = {0.f, 0.f, 0.f, 0.f}, p[4];
    if (known) load_f32x4(wte + id * C + c, e);
    load_f32x4(wpe + t * C + c, p);
    for (int k = 0; k < 4; ++k) e[k] += p[k];
    store_f32x4(x + r * C + c, e);
  }
}

// The embedding's backward pass for position t = blockIdx.x and column blockIdx.y *
// blockDim.x + threadIdx.x: dwpe[t, c] = sum over b of g[b, t, c] (written), and
// dwte[ids[b, t], c] += g[b, t, c] (atomicAdd into a zeroed dwte; ids outside [0, V) add
// nothing).
extern "C" __global__ void stage_worker_embed_bwd(const float *__restrict__ g,
                                                  const long long *__restrict__ ids,
                                                  float *__restrict__ dwte,
                                                  float *__restrict__ dwpe, int B, int T, int C,
                                                  int V) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const long long t = blockIdx.x;
  float s = 0.f;
  for (int b = 0; b < B; ++b) {
    const long long r = (long long)b * T + t;
    const float v = g[r * C + c];
    s += v;
    const long long id = ids[r];
    if (id >= 0 && id < V) atomicAdd(dwte + id * C + c, v);
  }
  dwpe[t * C + c] = s;
}

// ---- Cross-entropy over 256 classes (bf16 logits) ----

// The row's 256 logits, 8 per lane of the calling warp.
__device__ __forceinline__ void load_row256(const bf16_t *row, int lane, float v[8]) {
  load_bf16x4(row + lane * 8, v);
  load_bf16x4(row + lane * 8 + 4, v + 4);
}

// Whether target `tg` counts: not the ignored value and a class (libtorch would stop with a
// device-side assertion on any other value; the worker's targets are bytes or ignored).
__device__ __forceinline__ bool xent_counted(long long tg, long long ignore) {
  return tg != ignore && tg >= 0 && tg < 256;
}

// One warp per row of logits ([N, 256], bf16), rows strided over the grid (blockDim.x a
// multiple of 32): lse[r] = log(sum(exp(logits[r, :]))), and per block the sum of
// lse[r] - logits[r, target[r]] and the number of such rows over the counted rows (see
// xent_counted) into partial[blockIdx.x].
extern "C" __global__ void stage_worker_xent_fwd(const bf16_t *__restrict__ logits,
                                                 const long long *__restrict__ targets,
                                                 float *__restrict__ lse,
                                                 float2 *__restrict__ partial, long long N,
                                                 long long ignore) {
  __shared__ float2 red[32];
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  float loss = 0.f, count = 0.f;
  for (long long r = (long long)blockIdx.x * warps + (threadIdx.x >> 5); r < N;
       r += (long long)gridDim.x * warps) {
    const bf16_t *row = logits + r * 256;
    float v[8];
    load_row256(row, lane, v);
    float m = v[0];
    for (int k = 1; k < 8; ++k) m = fmaxf(m, v[k]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s = 0.f;
    for (int k = 0; k < 8; ++k) s += expf(v[k] - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float l = m + logf(s);
    const long long tg = targets[r];
    if (lane == 0) {
      lse[r] = l;
      if (xent_counted(tg, ignore)) {
        loss += l - bf2f(row[tg]);
        count += 1.f;
      }
    }
  }
  const float2 total = block_sum2(make_float2(loss, count), red);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// One block (blockDim.x a multiple of 32): loss = the sum of the partial losses over the
// number of counted rows (NaN when none counts, as libtorch's mean), and that number.
extern "C" __global__ void stage_worker_xent_finish(const float2 *__restrict__ partial,
                                                    int parts, float *__restrict__ loss,
                                                    float *__restrict__ count) {
  __shared__ double red[2][32];
  double s = 0.0, n = 0.0;
  for (int k = threadIdx.x; k < parts; k += blockDim.x) {
    s += (double)partial[k].x;
    n += (double)partial[k].y;
  }
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    n += __shfl_xor_sync(0xffffffffu, n, o);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    red[0][warp] = s;
    red[1][warp] = n;
  }
  __syncthreads();
  if (warp == 0) {
    const bool mine = lane < (int)(blockDim.x >> 5);
    s = mine ? red[0][lane] : 0.0;
    n = mine ? red[1][lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) {
      s += __shfl_xor_sync(0xffffffffu, s, o);
      n += __shfl_xor_sync(0xffffffffu, n, o);
    }
    if (lane == 0) {
      *loss = (float)(s / n);
      *count = (float)n;
    }
  }
}

// dlogits = bf16((softmax(logits[r, :]) - onehot(target[r])) * grad / count) for counted rows,
// 0 for the others; one warp per row as stage_worker_xent_fwd.
extern "C" __global__ void stage_worker_xent_bwd(const bf16_t *__restrict__ logits,
                                                 const long long *__restrict__ targets,
                                                 const float *__restrict__ lse,
                                                 const float *__restrict__ grad,
                                                 const float *__restrict__ count,
                                                 bf16_t *__restrict__ dlogits, long long N,
                                                 long long ignore) {
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const float scale = *grad / *count;
  for (long long r = (long long)blockIdx.x * warps + (threadIdx.x >> 5); r < N;
       r += (long long)gridDim.x * warps) {
    const long long tg = targets[r];
    float d[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (xent_counted(tg, ignore)) {
      float v[8];
      load_row256(logits + r * 256, lane, v);
      const float l = lse[r];
      for (int k = 0; k < 8; ++k) {
        const float hot = lane * 8 + k == tg ? 1.f : 0.f;
        d[k] = (expf(v[k] - l) - hot) * scale;
      }
    }
    store_bf16x4(dlogits + r * 256 + lane * 8, d);
    store_bf16x4(dlogits + r * 256 + lane * 8 + 4, d + 4);
  }
}
)CUDA";

// The few driver-API and NVRTC entry points used, declared here (their ABI is stable C).
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st *;
using CUmodule = struct CUmod_st *;
using CUfunction = struct CUfunc_st *;
using CUstream = struct CUstream_st *;
using nvrtcResult = int;
using nvrtcProgram = struct _nvrtcProgram *;

constexpr int kAttrMultiprocessors = 16;
constexpr int kAttrCcMajor = 75;
constexpr int kAttrCcMinor = 76;

struct Api {
  CUresult (*ctx_get_current)(CUcontext *);
  CUresult (*ctx_set_current)(CUcontext);
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*device_attribute)(int *, int, CUdevice);
  CUresult (*module_load_data)(CUmodule *, const void *);
  CUresult (*module_function)(CUfunction *, CUmodule, const char *);
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                     unsigned, CUstream, void **, void **);
  CUresult (*error_string)(CUresult, const char **);
};

struct Nvrtc {
  nvrtcResult (*create)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                        const char *const *);
  nvrtcResult (*compile)(nvrtcProgram, int, const char *const *);
  nvrtcResult (*log_size)(nvrtcProgram, size_t *);
  nvrtcResult (*log)(nvrtcProgram, char *);
  nvrtcResult (*cubin_size)(nvrtcProgram, size_t *);
  nvrtcResult (*cubin)(nvrtcProgram, char *);
  nvrtcResult (*destroy)(nvrtcProgram *);
  nvrtcResult (*version)(int *, int *);
  const char *(*error_string)(nvrtcResult);
};

template <typename F> void bind(void *lib, const char *name, F &slot) {
  void *p = dlsym(lib, name);
  if (p == nullptr) {
    throw std::runtime_error(std::string("symbol ") + name + " not found");
  }
  slot = reinterpret_cast<F>(p);
}

// The directory libtorch_cpu.so was loaded from ("" if none is loaded).
std::string libtorch_dir() {
  std::string dir;
  dl_iterate_phdr(
      [](struct dl_phdr_info *info, size_t, void *out) {
        const std::string path = info->dlpi_name ? info->dlpi_name : "";
        const std::string name = "/libtorch_cpu.so";
        if (path.size() > name.size() &&
            path.compare(path.size() - name.size(), name.size(), name) == 0) {
          *static_cast<std::string *>(out) = path.substr(0, path.size() - name.size());
          return 1;
        }
        return 0;
      },
      &dir);
  return dir;
}

// Loads `dir`'s libnvrtc-builtins.so.<version> (not the ".alt" variant), if there is one.
void preload_builtins(const std::string &dir) {
  DIR *d = opendir(dir.c_str());
  if (d == nullptr) return;
  const std::string prefix = "libnvrtc-builtins.so.";
  while (const struct dirent *e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) == 0) {
      dlopen((dir + "/" + name).c_str(), RTLD_NOW | RTLD_GLOBAL);
    }
  }
  closedir(d);
}

// libnvrtc as the wheel ships it: on the library path, or where the wheel puts the CUDA
// libraries, beside libtorch's package (the run path libtorch_cuda.so itself carries).
const Nvrtc &nvrtc() {
  static std::once_flag once;
  static Nvrtc api;
  static std::string error;
  std::call_once(once, [] {
    std::vector<std::string> names = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    const std::string torch = libtorch_dir();
    if (!torch.empty()) {
      names.push_back(torch + "/../../nvidia/cu13/lib/libnvrtc.so.13");
      names.push_back(torch + "/../../nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
    }
    void *lib = nullptr;
    for (const std::string &n : names) {
      const size_t slash = n.rfind('/');
      // libnvrtc opens its builtins by name, which the library path may not find when
      // libnvrtc itself was found by its path: load them from beside it first.
      if (slash != std::string::npos) preload_builtins(n.substr(0, slash));
      if ((lib = dlopen(n.c_str(), RTLD_NOW | RTLD_GLOBAL)) != nullptr) break;
    }
    if (lib == nullptr) {
      error = "libnvrtc was not found (neither on the library path nor beside libtorch)";
      return;
    }
    try {
      bind(lib, "nvrtcCreateProgram", api.create);
      bind(lib, "nvrtcCompileProgram", api.compile);
      bind(lib, "nvrtcGetProgramLogSize", api.log_size);
      bind(lib, "nvrtcGetProgramLog", api.log);
      bind(lib, "nvrtcGetCUBINSize", api.cubin_size);
      bind(lib, "nvrtcGetCUBIN", api.cubin);
      bind(lib, "nvrtcDestroyProgram", api.destroy);
      bind(lib, "nvrtcVersion", api.version);
      bind(lib, "nvrtcGetErrorString", api.error_string);
    } catch (const std::exception &e) {
      error = std::string("libnvrtc: ") + e.what();
    }
  });
  if (!error.empty()) throw std::runtime_error(error);
  return api;
}

const Api &driver() {
  static std::once_flag once;
  static Api api;
  static std::string error;
  std::call_once(once, [] {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) {
      error = "libcuda.so.1 was not found";
      return;
    }
    try {
      bind(lib, "cuCtxGetCurrent", api.ctx_get_current);
      bind(lib, "cuCtxSetCurrent", api.ctx_set_current);
      bind(lib, "cuDeviceGet", api.device_get);
      bind(lib, "cuDeviceGetAttribute", api.device_attribute);
      bind(lib, "cuModuleLoadData", api.module_load_data);
      bind(lib, "cuModuleGetFunction", api.module_function);
      bind(lib, "cuLaunchKernel", api.launch);
      bind(lib, "cuGetErrorString", api.error_string);
    } catch (const std::exception &e) {
      error = std::string("libcuda: ") + e.what();
    }
  });
  if (!error.empty()) throw std::runtime_error(error);
  return api;
}

void check(CUresult rc, const char *what) {
  if (rc != 0) {
    const char *text = nullptr;
    driver().error_string(rc, &text);
    throw std::runtime_error(std::string(what) + ": " + (text ? text : "CUDA error"));
  }
}

// The kernels compiled for `sm_<arch>` (e.g. 90) as a cubin.
std::vector<char> compile(int arch) {
  const Nvrtc &rt = nvrtc();
  nvrtcProgram prog = nullptr;
  if (rt.create(&prog, kSource, "stage_worker_fused.cu", 0, nullptr, nullptr) != 0) {
    throw std::runtime_error("nvrtcCreateProgram failed");
  }
  const std::string gpu = "--gpu-architecture=sm_" + std::to_string(arch);
  const char *options[] = {gpu.c_str(), "-std=c++17"};
  const nvrtcResult rc = rt.compile(prog, 2, options);
  std::string failure;
  if (rc != 0) {
    size_t n = 0;
    rt.log_size(prog, &n);
    std::string log(n, '\0');
    if (n > 0) rt.log(prog, log.data());
    failure = std::string("NVRTC could not compile the fused kernels for sm_") +
              std::to_string(arch) + " (" + rt.error_string(rc) + "): " + log;
  }
  std::vector<char> cubin;
  if (failure.empty()) {
    size_t n = 0;
    rt.cubin_size(prog, &n);
    cubin.resize(n);
    if (n > 0) rt.cubin(prog, cubin.data());
  }
  rt.destroy(&prog);
  if (!failure.empty()) throw std::runtime_error(failure);
  return cubin;
}

// Where compiled kernels are kept between processes: $STAGE_WORKER_KERNEL_CACHE, else
// $XDG_CACHE_HOME/stage-worker/kernels, else ~/.cache/stage-worker/kernels ("" for none).
std::string cache_dir() {
  if (const char *d = std::getenv("STAGE_WORKER_KERNEL_CACHE")) return d;
  if (const char *d = std::getenv("XDG_CACHE_HOME"); d != nullptr && *d != '\0') {
    return std::string(d) + "/stage-worker/kernels";
  }
  if (const char *d = std::getenv("HOME"); d != nullptr && *d != '\0') {
    return std::string(d) + "/.cache/stage-worker/kernels";
  }
  return "";
}

// The cache file for `sm_<arch>`: named by a hash of the source, the architecture and the
// NVRTC version, so that a changed kernel or compiler never finds a stale cubin.
std::string cache_path(int arch) {
  const std::string dir = cache_dir();
  if (dir.empty()) return "";
  int major = 0, minor = 0;
  if (nvrtc().version(&major, &minor) != 0) return "";
  const std::string key = std::string(kSource) + "\n" + std::to_string(arch) + "\n" +
                          std::to_string(major) + "." + std::to_string(minor);
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : key) {
    h = (h ^ ch) * 1099511628211ull;
  }
  char name[64];
  std::snprintf(name, sizeof name, "/fused-sm%d-%016llx.cubin", arch,
                static_cast<unsigned long long>(h));
  return dir + name;
}

std::vector<char> read_cached(const std::string &path) {
  std::vector<char> bytes;
  if (path.empty()) return bytes;
  std::ifstream in(path, std::ios::binary);
  if (!in) return bytes;
  bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (bytes.size() < 4 || std::memcmp(bytes.data(), "\x7f" "ELF", 4) != 0) bytes.clear();
  return bytes;
}

// Best effort: a cache that cannot be written only costs the next process a compile.
void write_cached(const std::string &path, const std::vector<char> &cubin) {
  if (path.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp-" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;
    out.write(cubin.data(), static_cast<std::streamsize>(cubin.size()));
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

struct Kernels {
  CUcontext context = nullptr;
  int ordinal = -1;
  int multiprocessors = 0;
  CUfunction forward = nullptr;
  CUfunction backward = nullptr;
  CUfunction parameters = nullptr;
  CUfunction colsum = nullptr;
  CUfunction gelu_colsum = nullptr;
  CUfunction colsum_parts = nullptr;
  CUfunction opt_sumsq = nullptr;
  CUfunction opt_finish = nullptr;
  CUfunction opt_adamw = nullptr;
  CUfunction zero_f32 = nullptr;
  CUfunction embed_fwd = nullptr;
  CUfunction embed_bwd = nullptr;
  CUfunction xent_fwd = nullptr;
  CUfunction xent_finish = nullptr;
  CUfunction xent_bwd = nullptr;
};

std::mutex loading;
Kernels loaded;
bool loaded_from_cache = false;
std::string load_error;

// Makes libtorch's context of device `ordinal` (the CUDA runtime's primary context) current on
// this thread, through the runtime libtorch itself loaded.
void runtime_select(int ordinal) {
  using SetDevice = int (*)(int);
  using Free = int (*)(void *);
  auto set_device = reinterpret_cast<SetDevice>(dlsym(RTLD_DEFAULT, "cudaSetDevice"));
  auto free = reinterpret_cast<Free>(dlsym(RTLD_DEFAULT, "cudaFree"));
  if (set_device == nullptr || free == nullptr) return;
  if (set_device(ordinal) == 0) free(nullptr);
}

// The kernels in the current CUDA context of device `ordinal`, compiled and loaded on first
// use. Later calls from any thread return the same functions; a failed load is not retried.
const Kernels &kernels(int ordinal) {
  std::lock_guard<std::mutex> guard(loading);
  if (!load_error.empty()) throw std::runtime_error(load_error);
  if (loaded.forward != nullptr) {
    if (loaded.ordinal != ordinal) throw std::runtime_error("the fused kernels serve one device");
    return loaded;
  }
  try {
    const Api &cu = driver();
    CUcontext ctx = nullptr;
    check(cu.ctx_get_current(&ctx), "cuCtxGetCurrent");
    if (ctx == nullptr) {
      runtime_select(ordinal);
      check(cu.ctx_get_current(&ctx), "cuCtxGetCurrent");
    }
    if (ctx == nullptr) throw std::runtime_error("no CUDA context is current on this thread");
    CUdevice dev = 0;
    check(cu.device_get(&dev, ordinal), "cuDeviceGet");
    int major = 0, minor = 0, sms = 0;
    check(cu.device_attribute(&major, kAttrCcMajor, dev), "cuDeviceGetAttribute");
    check(cu.device_attribute(&minor, kAttrCcMinor, dev), "cuDeviceGetAttribute");
    check(cu.device_attribute(&sms, kAttrMultiprocessors, dev), "cuDeviceGetAttribute");
    const int arch = major * 10 + minor;
    const std::string cached = cache_path(arch);
    std::vector<char> cubin = read_cached(cached);
    CUmodule module = nullptr;
    if (cubin.empty() || cu.module_load_data(&module, cubin.data()) != 0) {
      cubin = compile(arch);
      check(cu.module_load_data(&module, cubin.data()), "cuModuleLoadData");
      write_cached(cached, cubin);
      loaded_from_cache = false;
    } else {
      loaded_from_cache = true;
    }
    Kernels k;
    k.context = ctx;
    k.ordinal = ordinal;
    k.multiprocessors = sms;
    check(cu.module_function(&k.forward, module, "stage_worker_ln_fwd"), "cuModuleGetFunction");
    check(cu.module_function(&k.backward, module, "stage_worker_ln_bwd"), "cuModuleGetFunction");
    check(cu.module_function(&k.parameters, module, "stage_worker_ln_bwd_params"),
          "cuModuleGetFunction");
    check(cu.module_function(&k.colsum, module, "stage_worker_colsum_bf16"), "cuModuleGetFunction");
    check(cu.module_function(&k.gelu_colsum, module, "stage_worker_gelu_bwd_colsum"),
          "cuModuleGetFunction");
    check(cu.module_function(&k.colsum_parts, module, "stage_worker_colsum_parts"),
          "cuModuleGetFunction");
    check(cu.module_function(&k.opt_sumsq, module, "stage_worker_opt_sumsq"), "cuModuleGetFunction");
    check(cu.module_function(&k.opt_finish, module, "stage_worker_opt_finish"), "cuModuleGetFunction");
    check(cu.module_function(&k.opt_adamw, module, "stage_worker_opt_adamw"), "cuModuleGetFunction");
    check(cu.module_function(&k.zero_f32, module, "stage_worker_zero_f32"), "cuModuleGetFunction");
    check(cu.module_function(&k.embed_fwd, module, "stage_worker_embed_fwd"), "cuModuleGetFunction");
    check(cu.module_function(&k.embed_bwd, module, "stage_worker_embed_bwd"), "cuModuleGetFunction");
    check(cu.module_function(&k.xent_fwd, module, "stage_worker_xent_fwd"), "cuModuleGetFunction");
    check(cu.module_function(&k.xent_finish, module, "stage_worker_xent_finish"), "cuModuleGetFunction");
    check(cu.module_function(&k.xent_bwd, module, "stage_worker_xent_bwd"), "cuModuleGetFunction");
    loaded = k;
    return loaded;
  } catch (const std::exception &e) {
    load_error = e.what();
    throw;
  }
}

// Makes the kernels' context current on this thread (the autograd engine's threads have it
// already; a thread that never called CUDA may not).
void enter(const Kernels &k) {
  CUcontext ctx = nullptr;
  check(driver().ctx_get_current(&ctx), "cuCtxGetCurrent");
  if (ctx != k.context) check(driver().ctx_set_current(k.context), "cuCtxSetCurrent");
}

void launch(CUfunction f, unsigned blocks_x, unsigned threads_x, unsigned threads_y,
            std::vector<void *> args) {
  check(driver().launch(f, blocks_x, 1, 1, threads_x, threads_y, 1, 0, nullptr, args.data(),
                        nullptr),
        "cuLaunchKernel");
}

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

// The forward pass: {xn, a, mean, rstd} (xn undefined when y is).
std::vector<at::Tensor> ln_forward(const at::Tensor &x, const at::Tensor &y, const at::Tensor &w,
                                const at::Tensor &b, double eps) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  require(C % 128 == 0 && C <= 4096, "the fused LayerNorm takes a width that is a multiple of 128, at most 4096");
  check_operand(x, at::kFloat, N * C, "x must be a contiguous fp32 CUDA tensor");
  if (y.defined()) check_operand(y, at::kBFloat16, N * C, "y must be a contiguous bf16 tensor like x");
  check_operand(w, at::kFloat, C, "the LayerNorm weight must be fp32 of the last dimension's size");
  check_operand(b, at::kFloat, C, "the LayerNorm bias must be fp32 of the last dimension's size");
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

// The backward pass: {gx, gy, gw, gb} (gy undefined unless wanted).
std::vector<at::Tensor> ln_backward(const at::Tensor &ga_in, const at::Tensor &gres_in,
                                 const at::Tensor &xn, const at::Tensor &mean,
                                 const at::Tensor &rstd, const at::Tensor &w, bool want_gy) {
  const int64_t C = xn.size(-1), N = xn.numel() / C;
  const at::Tensor ga = ga_in.to(at::kBFloat16).contiguous();
  const at::Tensor gres = gres_in.defined() ? gres_in.to(at::kFloat).contiguous() : at::Tensor();
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
  at::Tensor pb = N > 0 ? at::empty({blocks, C}, xn.options()) : at::zeros({1, C}, xn.options());
  at::Tensor gw = at::empty({C}, xn.options());
  at::Tensor gb = at::empty({C}, xn.options());
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
struct ResidualLayerNorm : public torch::autograd::Function<ResidualLayerNorm> {
  static variable_list forward(AutogradContext *ctx, at::Tensor x, at::Tensor y, at::Tensor w,
                               at::Tensor b, double eps) {
    auto out = ln_forward(x.contiguous(), y.contiguous(), w.contiguous(), b.contiguous(), eps);
    ctx->save_for_backward({out[0], out[2], out[3], w});
    return {out[0], out[1]};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    auto g = ln_backward(grads[1], grads[0], s[0], s[1], s[2], s[3].contiguous(), true);
    return {g[0], g[1], g[2], g[3], at::Tensor()};
  }
};

// a = bf16(LayerNorm(x)): gradients for x, w and b.
struct LayerNormCast : public torch::autograd::Function<LayerNormCast> {
  static variable_list forward(AutogradContext *ctx, at::Tensor x, at::Tensor w, at::Tensor b,
                               double eps) {
    const at::Tensor xc = x.contiguous();
    auto out = ln_forward(xc, at::Tensor(), w.contiguous(), b.contiguous(), eps);
    ctx->save_for_backward({xc, out[2], out[3], w});
    return {out[1]};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    auto g = ln_backward(grads[0], at::Tensor(), s[0], s[1], s[2], s[3].contiguous(), false);
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
// with GELU's backward when there is one), also in fp32.
struct LinearBf16 : public torch::autograd::Function<LinearBf16> {
  static variable_list forward(AutogradContext *ctx, at::Tensor x, at::Tensor w, at::Tensor b,
                               bool gelu) {
    const int64_t in = w.size(1), out = w.size(0);
    require(x.scalar_type() == at::kBFloat16 && x.size(-1) == in, "x must be bf16 [.., in]");
    require(w.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && b.numel() == out,
            "the weight and bias must be fp32 [out, in] and [out]");
    const at::Tensor x2 = x.reshape({-1, in}).contiguous();
    const at::Tensor wb = w.to(at::kBFloat16);
    const at::Tensor z = at::addmm(b.to(at::kBFloat16), x2, wb.t());
    const at::Tensor y = gelu ? at::gelu(z) : z;
    ctx->save_for_backward({x2, wb, gelu ? z : at::Tensor()});
    ctx->saved_data["gelu"] = gelu;
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
    auto sums = column_sums(g, gelu ? z : at::Tensor());
    const at::Tensor gz = gelu ? sums[1] : g;
    const at::Tensor gx = at::mm(gz, wb).view(ctx->saved_data["x_shape"].toIntVector());
    const at::Tensor gw = at::mm(gz.t(), x2, at::kFloat);
    return {gx, gw, sums[0], at::Tensor()};
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
    *cached = loaded_from_cache;
    return 0;
  } catch (const std::exception &e) {
    return fail(e, err, err_len);
  }
}

// (*xn_out, *a_out) = (x + y, bf16(LayerNorm(x + y) * w + b)), recorded for autograd. With y
// null: *a_out = bf16(LayerNorm(x) * w + b) and *xn_out is left alone. New handles the caller
// owns.
extern "C" int stage_worker_residual_layer_norm(const at::Tensor *x, const at::Tensor *y,
                                                const at::Tensor *w, const at::Tensor *b,
                                                double eps, at::Tensor **xn_out,
                                                at::Tensor **a_out, char *err, size_t err_len) {
  try {
    if (y != nullptr) {
      auto out = ResidualLayerNorm::apply(*x, *y, *w, *b, eps);
      *xn_out = new at::Tensor(out[0]);
      *a_out = new at::Tensor(out[1]);
    } else {
      auto out = LayerNormCast::apply(*x, *w, *b, eps);
      *a_out = new at::Tensor(out[0]);
    }
    return 0;
  } catch (const std::exception &e) {
    return fail(e, err, err_len);
  }
}

// *y_out = x W^T + b (bf16, GELU applied when `gelu`), recorded for autograd with the
// gradients described at LinearBf16. A new handle the caller owns.
extern "C" int stage_worker_linear_bf16(const at::Tensor *x, const at::Tensor *w,
                                        const at::Tensor *b, bool gelu, at::Tensor **y_out,
                                        char *err, size_t err_len) {
  try {
    auto out = LinearBf16::apply(*x, *w, *b, gelu);
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
