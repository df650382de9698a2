// Which scaled_dot_product_attention kernels libtorch may pick, which tch does not bind.
// Called from stage-worker/src/model/attention.rs before the first attention of a stage.
#include <ATen/Context.h>

extern "C" void stage_worker_sdp_backends(bool flash, bool mem_efficient, bool math,
                                          bool cudnn) {
  auto &ctx = at::globalContext();
  ctx.setSDPUseFlash(flash);
  ctx.setSDPUseMemEfficient(mem_efficient);
  ctx.setSDPUseMath(math);
  ctx.setSDPUseCuDNN(cudnn);
}
