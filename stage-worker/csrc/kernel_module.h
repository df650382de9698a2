// Loading the kernels of kernels.cu into libtorch's CUDA context (kernel_module.cpp): NVRTC
// and the driver API reached by dlopen, the compiled cubin cached between processes, and a
// launch helper. Used by fused.cpp's autograd functions and entry points.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace sw_kernels {

// The few driver-API and NVRTC entry points used, declared here (their ABI is stable C).
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st *;
using CUmodule = struct CUmod_st *;
using CUfunction = struct CUfunc_st *;
using CUstream = struct CUstream_st *;
using nvrtcResult = int;
using nvrtcProgram = struct _nvrtcProgram *;

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

// The module's kernels, loaded into one device's context.
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
  CUfunction rope = nullptr;
  CUfunction swiglu_fwd = nullptr;
  CUfunction swiglu_bwd = nullptr;
  CUfunction xent_rows_fwd = nullptr;
  CUfunction xent_rows_bwd = nullptr;
};

// The driver API (libcuda.so.1, by dlopen); throws when it is not there.
const Api &driver();

// Throws std::runtime_error naming `what` and the driver's message unless `rc` is 0.
void check(CUresult rc, const char *what);

// The kernels compiled for `sm_<arch>` (e.g. 90) as a cubin.
std::vector<char> compile(int arch);

// The kernels in the current CUDA context of device `ordinal`, compiled and loaded on first
// use. Later calls from any thread return the same functions; a failed load is not retried.
const Kernels &kernels(int ordinal);

// Whether the loaded cubin came from the cache (see cache_dir) rather than from NVRTC.
bool kernels_from_cache();

// Makes the kernels' context current on this thread (the autograd engine's threads have it
// already; a thread that never called CUDA may not).
void enter(const Kernels &k);

// Launches `f` on the default stream over `blocks_x` blocks of threads_x x threads_y threads.
void launch(CUfunction f, unsigned blocks_x, unsigned threads_x, unsigned threads_y,
            std::vector<void *> args);

}  // namespace sw_kernels
