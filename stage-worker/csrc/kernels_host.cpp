// The Llama kernels of kernels.cu (the rotary embedding, SwiGLU and the cross-entropy of a
// large vocabulary) compiled for the host, so that fused.cpp's autograd functions run on CPU
// tensors too and the CPU tests exercise them (and their gradients) against libtorch's plain
// operations. Blocks of one thread: those kernels stride over their whole range (a row, for
// the cross-entropy, whose blocks run here one after the other), so that one thread does all
// of it. The kernels that synchronise a block are compiled here too (kernels.cu is
// one file; their C names do not clash with any host symbol) but never run: their warp and
// block primitives throw.
#include "kernels_host.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace {
struct dim3 {
  unsigned x = 0, y = 0, z = 0;
};
thread_local dim3 threadIdx, blockIdx;
const dim3 blockDim{1, 1, 1}, gridDim{1, 1, 1};
struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float rsqrtf(float v) { return 1.f / std::sqrt(v); }
template <class T> T __shfl_xor_sync(unsigned, T, int) {
  throw std::logic_error("a warp shuffle in a kernel the host does not run");
}
inline void __syncthreads() { throw std::logic_error("a block barrier in a kernel the host does not run"); }
inline float atomicAdd(float *, float) { throw std::logic_error("an atomic in a kernel the host does not run"); }
using std::max;
using std::min;
}  // namespace

#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define stage_worker_rope host_rope
#define stage_worker_swiglu_fwd host_swiglu_fwd
#define stage_worker_swiglu_bwd host_swiglu_bwd
#define stage_worker_xent_rows_fwd host_xent_rows_fwd
#define stage_worker_xent_rows_bwd host_xent_rows_bwd
#include "kernels.cu"

namespace sw_host {

namespace {
// Block `b`, thread 0: where each host call starts (the rows' loops move the block).
void at_block(unsigned b) {
  blockIdx = dim3{b, 0, 0};
  threadIdx = dim3{};
}
}  // namespace

void rope(const uint16_t *x, const float *cos_t, const float *sin_t, uint16_t *out,
          long long rows, int T, int H, int D, float sign) {
  at_block(0);
  host_rope(x, cos_t, sin_t, out, rows, T, H, D, sign);
}

void swiglu_fwd(const uint16_t *gate, const uint16_t *up, uint16_t *out, long long n) {
  at_block(0);
  host_swiglu_fwd(gate, up, out, n);
}

void swiglu_bwd(const uint16_t *go, const uint16_t *gate, const uint16_t *up, uint16_t *d_gate,
                uint16_t *d_up, long long n) {
  at_block(0);
  host_swiglu_bwd(go, gate, up, d_gate, d_up, n);
}

void xent_rows_fwd(const uint16_t *logits, const long long *targets, float *lse, float *loss,
                   float *count, long long rows, int V, long long ignore) {
  for (long long r = 0; r < rows; ++r) {
    at_block(static_cast<unsigned>(r));
    host_xent_rows_fwd(logits, targets, lse, loss, count, V, ignore);
  }
  at_block(0);
}

void xent_rows_bwd(const uint16_t *logits, const long long *targets, const float *lse,
                   const float *grad, const float *count, uint16_t *d, long long rows, int V,
                   long long ignore) {
  for (long long r = 0; r < rows; ++r) {
    at_block(static_cast<unsigned>(r));
    host_xent_rows_bwd(logits, targets, lse, grad, count, d, V, ignore);
  }
  at_block(0);
}

}  // namespace sw_host
