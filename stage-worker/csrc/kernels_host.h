// kernels.cu's Llama kernels on the host (kernels_host.cpp), for fused.cpp's
// autograd functions given CPU tensors. Same arguments as the kernels; bf16 as raw bits.
#pragma once

#include <cstdint>

namespace sw_host {

void rope(const uint16_t *x, const float *cos_t, const float *sin_t, uint16_t *out,
          long long rows, int T, int H, int D, float sign);
void swiglu_fwd(const uint16_t *gate, const uint16_t *up, uint16_t *out, long long n);
void swiglu_bwd(const uint16_t *go, const uint16_t *gate, const uint16_t *up, uint16_t *d_gate,
                uint16_t *d_up, long long n);

void xent_rows_fwd(const uint16_t *logits, const long long *targets, float *lse, float *loss,
                   float *count, long long rows, int V, long long ignore);
void xent_rows_bwd(const uint16_t *logits, const long long *targets, const float *lse,
                   const float *grad, const float *count, uint16_t *d, long long rows, int V,
                   long long ignore);

}  // namespace sw_host
