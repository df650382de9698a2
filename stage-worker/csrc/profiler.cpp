// libtorch's own profiler (Kineto: operators on the CPU, kernels and copies on the GPU), which
// tch does not bind. Called from stage-worker/src/stages/profile.rs around a few training steps; the
// trace it saves is the Chrome trace format that torch.profiler's export_chrome_trace writes.
//
// Both calls return 0, or 1 with a message in `err` (a libtorch exception must not unwind
// into Rust).
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdio>
#include <exception>
#include <set>
#include <string>

namespace {
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::set<ActivityType> activities(bool cuda) {
  std::set<ActivityType> a{ActivityType::CPU};
  if (cuda) {
    a.insert(ActivityType::CUDA);
  }
  return a;
}
}  // namespace

extern "C" int stage_worker_profiler_start(bool cuda, char *err, size_t err_len) {
  try {
    ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
    torch::autograd::profiler::prepareProfiler(config, activities(cuda));
    torch::autograd::profiler::enableProfiler(config, activities(cuda));
    return 0;
  } catch (const std::exception &e) {
    std::snprintf(err, err_len, "%s", e.what());
    return 1;
  }
}

extern "C" int stage_worker_profiler_stop(const char *path, char *err, size_t err_len) {
  try {
    auto result = torch::autograd::profiler::disableProfiler();
    result->save(std::string(path));
    return 0;
  } catch (const std::exception &e) {
    std::snprintf(err, err_len, "%s", e.what());
    return 1;
  }
}
