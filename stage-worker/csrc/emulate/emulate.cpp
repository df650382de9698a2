// Runs the NVRTC kernels of kernels.cu on the host, against plain reference loops: the
// embedding, cross-entropy and AdamW kernels, whose results are checked here for their
// indexing, bounds and reductions without a GPU (the GPU's own check is `stage-worker
// check-kernels`). Built and run by run.sh, which compiles this file with kernels.cu
// included below (each `extern "C" __global__` kernel becomes a plain host function); a
// development aid, not part of the build.
#include <barrier>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <vector>
#include <random>
#include <algorithm>
#include <memory>
#include <mutex>
struct dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static std::unique_ptr<std::barrier<>> block_bar;
static std::vector<std::unique_ptr<std::barrier<>>> warp_bar;
static double slots[1024];
template <class T> T __shfl_xor_sync(unsigned, T v, int o) {
  const int t = threadIdx.x, w = t >> 5;
  slots[t] = (double)v;
  warp_bar[w]->arrive_and_wait();
  T r = (T)slots[t ^ o];
  warp_bar[w]->arrive_and_wait();
  return r;
}
inline void __syncthreads() { block_bar->arrive_and_wait(); }
static std::mutex atomic_lock;
inline float atomicAdd(float *p, float v) {
  std::lock_guard<std::mutex> g(atomic_lock);
  float o = *p;
  *p += v;
  return o;
}
using std::min; using std::max;
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
#include "../kernels.cu"
// Runs kernel body `f` over a grid of gx x gy blocks of bx threads, one block at a time, every
// thread of the block on its own host thread (so that __syncthreads and the warp shuffles
// meet as on the GPU).
template <class F> void run(unsigned gx, unsigned gy, unsigned bx, F f) {
  gridDim = {gx, gy, 1};
  blockDim = {bx, 1, 1};
  for (unsigned y = 0; y < gy; ++y) {
    for (unsigned x = 0; x < gx; ++x) {
      block_bar = std::make_unique<std::barrier<>>(bx);
      warp_bar.clear();
      for (unsigned w = 0; w < bx / 32; ++w) warp_bar.push_back(std::make_unique<std::barrier<>>(32));
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < bx; ++t) {
        ts.emplace_back([=] {
          blockIdx = {x, y, 0};
          threadIdx = {t, 0, 0};
          f();
        });
      }
      for (auto &t : ts) t.join();
    }
  }
}

float bf(float f) { return bf2f(f2bf(f)); }

int main() {
  std::mt19937 rng(2); std::normal_distribution<float> nd;
  int bad = 0;
  { // sumsq + finish
    std::vector<float> g1(5000), g3(77); for (auto &v : g1) v = nd(rng); for (auto &v : g3) v = nd(rng);
    OptTable t; memset(&t, 0, sizeof t);
    t.e[0] = {g1.data(), 0, 5000, 0.f, 0}; t.e[1] = {nullptr, 5000, 40, 0.f, 3}; t.e[2] = {g3.data(), 5040, 77, 0.f, 4};
    t.count = 3; t.blocks = 6;
    std::vector<float> partial(6, -1);
    float *pp = partial.data();
    run(t.blocks, 1, 64, [&] { stage_worker_opt_sumsq(t, pp); });
    double ref = 0; for (float v : g1) ref += v*v; for (float v : g3) ref += v*v;
    double got = 0; for (float v : partial) got += v;
    printf("sumsq %g vs %g\n", got, ref); bad += std::fabs(got - ref) > 1e-3 * ref;
    float norm = 0, step = 4, opt[3];
    const float *cp = pp; int parts = 6;
    run(1, 1, 256, [&] { stage_worker_opt_finish(cp, parts, 1.f / 1.5f, 0.9, 0.95, &norm, &step, opt); });
    double n = std::sqrt(ref);
    printf("norm %g vs %g, scale %g vs %g, step %g, bc1 %g vs %g, bc2s %g vs %g\n", norm, n, opt[0], std::max((n+1e-6)/1.5, 1.0), step,
           opt[1], 1 - std::pow(0.9, 5), opt[2], std::sqrt(1 - std::pow(0.95, 5)));
    bad += std::fabs(norm - n) > 1e-4 * n || step != 5 || std::fabs(opt[1] - (1 - std::pow(0.9, 5))) > 1e-6;
  }
  { // xent fwd + finish
    const long long N = 45, ign = -100;
    std::vector<unsigned short> lg(N*256); std::vector<long long> tg(N); std::vector<float> lse(N);
    for (auto &v : lg) v = f2bf(3 * nd(rng));
    for (int r = 0; r < N; ++r) tg[r] = r % 4 == 1 ? ign : (r * 53) % 256;
    tg[2] = -3;
    double sum = 0, count = 0; std::vector<double> rl(N);
    for (int r = 0; r < N; ++r) { double m = -1e30, s = 0; for (int j = 0; j < 256; ++j) m = std::max(m, (double)bf2f(lg[r*256+j]));
      for (int j = 0; j < 256; ++j) s += std::exp(bf2f(lg[r*256+j]) - m); rl[r] = m + std::log(s);
      if (tg[r] != ign && tg[r] >= 0 && tg[r] < 256) { count += 1; sum += rl[r] - bf2f(lg[r*256+tg[r]]); } }
    const int blocks = 3;
    std::vector<float2> partial(blocks);
    const unsigned short *pl = lg.data(); const long long *pt = tg.data(); float *pls = lse.data(); float2 *pp = partial.data();
    long long n = N;
    run(blocks, 1, 64, [&] { stage_worker_xent_fwd(pl, pt, pls, pp, n, ign); });
    double le = 0; for (int r = 0; r < N; ++r) le = std::max(le, std::fabs(lse[r] - rl[r]));
    float loss = 0, cnt = 0; const float2 *cp = pp; int parts = blocks;
    run(1, 1, 256, [&] { stage_worker_xent_finish(cp, parts, &loss, &cnt); });
    printf("lse err %g, loss %g vs %g, count %g vs %g\n", le, loss, sum / count, cnt, count);
    bad += le > 1e-4 || std::fabs(loss - sum / count) > 1e-4 * std::fabs(sum / count) || cnt != count;
  }

  
  // embedding
  { const int B = 3, T = 5, C = 128, V = 7, P = 9;
    std::vector<float> wte(V*C), wpe(P*C), x(B*T*C), g(B*T*C), dwte(V*C, 0), dwpe(P*C, 0);
    std::vector<long long> ids(B*T);
    for (auto &v : wte) v = nd(rng); for (auto &v : wpe) v = nd(rng); for (auto &v : g) v = nd(rng);
    for (int i = 0; i < B*T; ++i) ids[i] = (i * 5 + 1) % (V + 1) - (i == 4 ? 3 : 0);  // includes V and a negative
    const long long *pi = ids.data(); const float *pe = wte.data(), *pp = wpe.data(); float *px = x.data();
    run(B*T, 1, 32, [&] { stage_worker_embed_fwd(pi, pe, pp, px, T, C, V); });
    double err = 0;
    for (int r = 0; r < B*T; ++r) for (int c = 0; c < C; ++c) {
      long long id = ids[r]; float e = (id >= 0 && id < V) ? wte[id*C+c] : 0.f;
      err = std::max(err, (double)std::fabs(x[r*C+c] - (e + wpe[(r%T)*C+c])));
    }
    printf("embed_fwd err %g\n", err); bad += err > 0;
    long long n = dwpe.size(); float *pz = dwpe.data();
    for (auto &v : dwpe) v = 5; run(2, 1, 64, [&] { stage_worker_zero_f32(pz, n); });
    double z = 0; for (auto v : dwpe) z += std::fabs(v); printf("zero %g\n", z); bad += z > 0;
    const float *pg = g.data(); float *pdt = dwte.data(), *pdp = dwpe.data();
    run(T, (C + 63) / 64, 64, [&] { stage_worker_embed_bwd(pg, pi, pdt, pdp, B, T, C, V); });
    std::vector<double> rt(V*C, 0), rp(P*C, 0);
    for (int b = 0; b < B; ++b) for (int t = 0; t < T; ++t) for (int c = 0; c < C; ++c) {
      int r = b*T+t; long long id = ids[r]; if (id >= 0 && id < V) rt[id*C+c] += g[r*C+c]; rp[t*C+c] += g[r*C+c]; }
    double e1 = 0, e2 = 0;
    for (int i = 0; i < V*C; ++i) e1 = std::max(e1, std::fabs(dwte[i] - rt[i]));
    for (int i = 0; i < P*C; ++i) e2 = std::max(e2, std::fabs(dwpe[i] - rp[i]));
    printf("embed_bwd err %g %g\n", e1, e2); bad += e1 > 1e-5 || e2 > 1e-5;
  }
  // cross-entropy backward
  { const long long N = 37; const long long ign = -100;
    std::vector<unsigned short> lg(N*256), d(N*256, 0xffff); std::vector<long long> tg(N); std::vector<float> lse(N);
    for (auto &v : lg) v = f2bf(3 * nd(rng));
    for (int r = 0; r < N; ++r) tg[r] = r % 5 == 0 ? ign : (r * 37) % 256;
    tg[3] = 256;
    double count = 0;
    for (int r = 0; r < N; ++r) { double m = -1e30, s = 0; for (int j = 0; j < 256; ++j) m = std::max(m, (double)bf2f(lg[r*256+j]));
      for (int j = 0; j < 256; ++j) s += std::exp(bf2f(lg[r*256+j]) - m); lse[r] = m + std::log(s);
      if (tg[r] != ign && tg[r] >= 0 && tg[r] < 256) count += 1; }
    float grad = 1.7f, cnt = count;
    const unsigned short *pl = lg.data(); const long long *pt = tg.data(); const float *pls = lse.data(); unsigned short *pd = d.data();
    long long n = N;
    run(2, 1, 64, [&] { stage_worker_xent_bwd(pl, pt, pls, &grad, &cnt, pd, n, ign); });
    double err = 0;
    for (int r = 0; r < N; ++r) for (int j = 0; j < 256; ++j) {
      bool counted = tg[r] != ign && tg[r] >= 0 && tg[r] < 256;
      double ref = counted ? (std::exp(bf2f(lg[r*256+j]) - lse[r]) - (j == tg[r])) * grad / count : 0;
      err = std::max(err, std::fabs(bf2f(d[r*256+j]) - ref) / std::max(std::fabs(ref), 1e-30) * (ref != 0 || bf2f(d[r*256+j]) != 0));
    }
    printf("xent_bwd relative err %g (bf16 half ulp 0.0039)\n", err); bad += err > 0.0040;
  }
  // adamw
  { std::vector<float> flat(1000), m(1000), v(1000), g1(300), g2(123);
    for (auto &x : flat) x = nd(rng); for (auto &x : m) x = 0.1f*nd(rng); for (auto &x : v) x = std::fabs(0.01f*nd(rng));
    for (auto &x : g1) x = nd(rng); for (auto &x : g2) x = nd(rng);
    auto f0 = flat, m0 = m, v0 = v;
    OptTable t; memset(&t, 0, sizeof t);
    t.e[0] = {g1.data(), 10, 300, 0.1f, 0}; t.e[1] = {nullptr, 400, 50, 0.f, 2}; t.e[2] = {g2.data(), 600, 123, 0.f, 3};
    t.count = 3; t.blocks = 5;
    float opt[3] = {2.f, 0.19f, 0.3f};
    float *pf = flat.data(), *pm = m.data(), *pv = v.data();
    run(t.blocks, 1, 32, [&] { stage_worker_opt_adamw(t, pf, pm, pv, opt, 0.01f, 0.9f, 0.95f, 1e-8f); });
    std::vector<float> rf = f0, rm = m0, rv = v0;
    auto upd = [&](const float *g, long long off, long long len, float wd) {
      for (long long k = 0; k < len; ++k) { long long at = off + k; float gk = g ? g[k] / opt[0] : 0.f;
        float p = rf[at]; p -= 0.01f * wd * p; float mm = 0.9f*rm[at] + 0.1f*gk; float vv = 0.95f*rv[at] + (1.f-0.95f)*gk*gk;
        rm[at] = mm; rv[at] = vv; p -= (0.01f/opt[1]) * mm / (std::sqrt(vv)/opt[2] + 1e-8f); rf[at] = p; } };
    upd(g1.data(), 10, 300, 0.1f); upd(nullptr, 400, 50, 0.f); upd(g2.data(), 600, 123, 0.f);
    double e = 0; for (int i = 0; i < 1000; ++i) e = std::max({e, (double)std::fabs(rf[i]-flat[i]), (double)std::fabs(rm[i]-m[i]), (double)std::fabs(rv[i]-v[i])});
    int touched = 0; for (int i = 0; i < 1000; ++i) touched += flat[i] != f0[i] || m[i] != m0[i];
    printf("adamw err %g, touched %d (expect %d)\n", e, touched, 300 + 50 + 123); bad += e > 1e-6;
  }
  printf(bad ? "FAILED\n" : "ALL OK\n");
  return bad;
}
