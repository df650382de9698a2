// The kernels of kernels.cu in libtorch's CUDA context: compiled at run time by NVRTC for the
// device's own architecture (the wheel's libnvrtc, found next to libtorch) and launched through
// the driver API, both reached by dlopen: nothing here needs the CUDA toolkit at build time.
// They run on the legacy default stream, which is libtorch's default stream; the worker never
// switches streams. See kernel_module.h.

#include "kernel_module.h"


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

namespace sw_kernels {

// The CUDA source of kernels.cu, which build.rs writes out as a raw string literal.
const char *const kSource =
#include "kernels_cu.inc"
    ;

constexpr int kAttrMultiprocessors = 16;
constexpr int kAttrCcMajor = 75;
constexpr int kAttrCcMinor = 76;

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

std::mutex loading;
Kernels loaded;
bool loaded_from_cache = false;
std::string load_error;

bool kernels_from_cache() { return loaded_from_cache; }

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
    check(cu.module_function(&k.rope, module, "stage_worker_rope"), "cuModuleGetFunction");
    check(cu.module_function(&k.swiglu_fwd, module, "stage_worker_swiglu_fwd"), "cuModuleGetFunction");
    check(cu.module_function(&k.swiglu_bwd, module, "stage_worker_swiglu_bwd"), "cuModuleGetFunction");
    check(cu.module_function(&k.xent_rows_fwd, module, "stage_worker_xent_rows_fwd"), "cuModuleGetFunction");
    check(cu.module_function(&k.xent_rows_bwd, module, "stage_worker_xent_rows_bwd"), "cuModuleGetFunction");
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

}  // namespace sw_kernels
