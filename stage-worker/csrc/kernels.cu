// The worker's CUDA kernels, compiled at run time by NVRTC (kernel_module.cpp, which
// build.rs hands this file as a string) and run on the host by emulate/ (which includes it
// directly). Every kernel is `extern "C"` so that the module finds it by name.
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
// normalised as it is); a = bf16(LayerNorm(xn) * w + b); the row's mean and 1/std. With b
// null, RMSNorm instead: a = bf16(xn / sqrt(mean(xn^2) + eps) * w), the mean written as 0.
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
  const bool rms = b == nullptr;
  const float mean = rms ? 0.f : block_sum2(make_float2(v[0] + v[1] + v[2] + v[3], 0.f), red).x / C;
  float d[4], q = 0.f;
  for (int k = 0; k < 4; ++k) {
    d[k] = v[k] - mean;
    q += d[k] * d[k];
  }
  const float rstd = rsqrtf(block_sum2(make_float2(q, 0.f), red).x / C + eps);
  float wv[4], bv[4] = {0.f, 0.f, 0.f, 0.f}, o[4];
  load_f32x4(w + threadIdx.x * 4, wv);
  if (!rms) load_f32x4(b + threadIdx.x * 4, bv);
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
// partial sums of ga * xhat and ga per column go to pw and pb (row blockIdx.x). With pb null,
// RMSNorm's (the forward pass without b): no centring term, no bias sums.
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
    const float mg = pb == nullptr ? 0.f : s.x / C, mgx = s.y / C;
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
  if (pb != nullptr) store_f32x4(pb + (long long)blockIdx.x * C + c, accb);
}

// dw, db = the column sums of pw, pb ([parts, C]; pb and db null: dw only). Blocks of 32 x 8
// threads, C / 32 blocks.
extern "C" __global__ void stage_worker_ln_bwd_params(const float *__restrict__ pw,
                                                      const float *__restrict__ pb, int parts,
                                                      int C, float *__restrict__ dw,
                                                      float *__restrict__ db) {
  __shared__ float sw[8][33], sb[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float aw = 0.f, ab = 0.f;
  for (int p = threadIdx.y; p < parts; p += 8) {
    aw += pw[(long long)p * C + col];
    if (pb != nullptr) ab += pb[(long long)p * C + col];
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
    if (db != nullptr) db[col] = ab;
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

// ---- Llama: rotary embedding and SwiGLU (bf16 activations, fp32 arithmetic) ----

// Rotary position embedding of x ([rows, H * D] bf16, row r at position r % T, every head's D
// values in two halves), with cos and sin ([T, D / 2] fp32): for j < D / 2,
//   out[j] = x[j] cos - x[j + D/2] sin,   out[j + D/2] = x[j + D/2] cos + x[j] sin,
// rounded once to bf16. The backward pass is the same rotation by the opposite angle, which
// `sign` = -1 gives (sin taken negated). Rows strided over the blocks, a row's pairs over the
// block's threads.
extern "C" __global__ void stage_worker_rope(const bf16_t *__restrict__ x,
                                             const float *__restrict__ cos_t,
                                             const float *__restrict__ sin_t,
                                             bf16_t *__restrict__ out, long long rows, int T,
                                             int H, int D, float sign) {
  const int half = D / 2;
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long table = (row % T) * half;
    const long long base = row * H * D;
    for (int i = threadIdx.x; i < H * half; i += blockDim.x) {
      const int h = i / half, j = i - h * half;
      const long long at = base + (long long)h * D + j;
      const float c = cos_t[table + j], s = sign * sin_t[table + j];
      const float a = bf2f(x[at]), b = bf2f(x[at + half]);
      out[at] = (bf16_t)f2bf(a * c - b * s);
      out[at + half] = (bf16_t)f2bf(b * c + a * s);
    }
  }
}

__device__ __forceinline__ float sigmoid_f(float v) { return 1.f / (1.f + expf(-v)); }

// out = bf16(silu(gate) * up) over n elements (bf16), silu(v) = v * sigmoid(v), grid-stride,
// four elements a step (the tensors are 16-byte aligned; a tail of n % 4 one at a time).
extern "C" __global__ void stage_worker_swiglu_fwd(const bf16_t *__restrict__ gate,
                                                   const bf16_t *__restrict__ up,
                                                   bf16_t *__restrict__ out, long long n) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (long long q = first; q < n / 4; q += stride) {
    float g[4], u[4], o[4];
    load_bf16x4(gate + 4 * q, g);
    load_bf16x4(up + 4 * q, u);
    for (int k = 0; k < 4; ++k) o[k] = g[k] * sigmoid_f(g[k]) * u[k];
    store_bf16x4(out + 4 * q, o);
  }
  for (long long k = n / 4 * 4 + first; k < n; k += stride) {
    const float g = bf2f(gate[k]), u = bf2f(up[k]);
    out[k] = (bf16_t)f2bf(g * sigmoid_f(g) * u);
  }
}

// The gradients of out = silu(gate) * up for the output's gradient go (all bf16):
//   d_gate = go * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate))),   d_up = go * silu(gate).
__device__ __forceinline__ void swiglu_grad(float o, float g, float u, float *dg, float *du) {
  const float s = sigmoid_f(g);
  *dg = o * u * s * (1.f + g * (1.f - s));
  *du = o * g * s;
}

extern "C" __global__ void stage_worker_swiglu_bwd(const bf16_t *__restrict__ go,
                                                   const bf16_t *__restrict__ gate,
                                                   const bf16_t *__restrict__ up,
                                                   bf16_t *__restrict__ d_gate,
                                                   bf16_t *__restrict__ d_up, long long n) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (long long q = first; q < n / 4; q += stride) {
    float o[4], g[4], u[4], dg[4], du[4];
    load_bf16x4(go + 4 * q, o);
    load_bf16x4(gate + 4 * q, g);
    load_bf16x4(up + 4 * q, u);
    for (int k = 0; k < 4; ++k) swiglu_grad(o[k], g[k], u[k], dg + k, du + k);
    store_bf16x4(d_gate + 4 * q, dg);
    store_bf16x4(d_up + 4 * q, du);
  }
  for (long long k = n / 4 * 4 + first; k < n; k += stride) {
    float dg, du;
    swiglu_grad(bf2f(go[k]), bf2f(gate[k]), bf2f(up[k]), &dg, &du);
    d_gate[k] = (bf16_t)f2bf(dg);
    d_up[k] = (bf16_t)f2bf(du);
  }
}

// ---- Cross-entropy over a large vocabulary (bf16 logits, one block per row) ----

// (max, sum of exp(v - max)) of two parts of a row, merged.
__device__ __forceinline__ float2 lse_merge(float2 a, float2 b) {
  const float m = fmaxf(a.x, b.x);
  return make_float2(m, a.y * expf(a.x - m) + b.y * expf(b.x - m));
}

// lse_merge over the block, in every thread (blockDim.x a multiple of 32, or 1: the host's
// single thread, which holds the whole row already).
__device__ __forceinline__ float2 block_lse(float2 v, float2 *shared) {
  if (blockDim.x == 1) return v;
  for (int o = 16; o > 0; o >>= 1) {
    v = lse_merge(v, make_float2(__shfl_xor_sync(0xffffffffu, v.x, o),
                                 __shfl_xor_sync(0xffffffffu, v.y, o)));
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? shared[lane] : make_float2(-1e30f, 0.f);
  for (int o = 16; o > 0; o >>= 1) {
    v = lse_merge(v, make_float2(__shfl_xor_sync(0xffffffffu, v.x, o),
                                 __shfl_xor_sync(0xffffffffu, v.y, o)));
  }
  return v;
}

// Row blockIdx.x of logits ([N, V] bf16, V a multiple of 4): lse[r] = log(sum(exp(row))), and
// for a counted target (not `ignore`, in [0, V)) loss[r] = lse[r] - row[target], count[r] = 1;
// otherwise both 0.
extern "C" __global__ void stage_worker_xent_rows_fwd(const bf16_t *__restrict__ logits,
                                                      const long long *__restrict__ targets,
                                                      float *__restrict__ lse,
                                                      float *__restrict__ loss,
                                                      float *__restrict__ count, int V,
                                                      long long ignore) {
  __shared__ float2 red[32];
  const long long r = blockIdx.x;
  const bf16_t *row = logits + r * V;
  float2 acc = make_float2(-1e30f, 0.f);
  for (int c = threadIdx.x * 4; c < V; c += blockDim.x * 4) {
    float v[4];
    load_bf16x4(row + c, v);
    const float m = fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]));
    const float s = expf(v[0] - m) + expf(v[1] - m) + expf(v[2] - m) + expf(v[3] - m);
    acc = lse_merge(acc, make_float2(m, s));
  }
  acc = block_lse(acc, red);
  if (threadIdx.x == 0) {
    const float l = acc.x + logf(acc.y);
    const long long tg = targets[r];
    const bool counted = tg != ignore && tg >= 0 && tg < V;
    lse[r] = l;
    loss[r] = counted ? l - bf2f(row[tg]) : 0.f;
    count[r] = counted ? 1.f : 0.f;
  }
}

// The logits' gradient (bf16) of the mean loss over `count[0]` counted rows, times the loss's
// gradient grad[0]: (softmax(row) - onehot(target)) * grad / count for a counted row, else 0.
extern "C" __global__ void stage_worker_xent_rows_bwd(const bf16_t *__restrict__ logits,
                                                      const long long *__restrict__ targets,
                                                      const float *__restrict__ lse,
                                                      const float *__restrict__ grad,
                                                      const float *__restrict__ count,
                                                      bf16_t *__restrict__ d, int V,
                                                      long long ignore) {
  const long long r = blockIdx.x;
  const long long tg = targets[r];
  const bool counted = tg != ignore && tg >= 0 && tg < V;
  const float scale = counted ? grad[0] / count[0] : 0.f;
  const float l = lse[r];
  const bf16_t *row = logits + r * V;
  for (int c = threadIdx.x * 4; c < V; c += blockDim.x * 4) {
    float v[4], o[4];
    load_bf16x4(row + c, v);
    for (int k = 0; k < 4; ++k) o[k] = (expf(v[k] - l) - (c + k == tg ? 1.f : 0.f)) * scale;
    store_bf16x4(d + r * V + c, o);
  }
}
