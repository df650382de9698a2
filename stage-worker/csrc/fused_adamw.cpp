// One AdamW step over flat fp32 buffers with libtorch's fused kernel (`_fused_adamw_`, one
// kernel for the whole update), which tch does not bind. Called from stage-worker/src/optim.rs.
//
// Tensors arrive as tch's handles (`at::Tensor *`). Returns 0, or 1 with a message in `err`
// (a libtorch exception must not unwind into Rust).
#include <ATen/core/Tensor.h>
#include <ATen/ops/_fused_adamw.h>

#include <cstdio>
#include <exception>
#include <optional>

extern "C" int stage_worker_fused_adamw(const at::Tensor *param, const at::Tensor *grad,
                                        const at::Tensor *exp_avg, const at::Tensor *exp_avg_sq,
                                        const at::Tensor *step, double lr,
                                        double beta1, double beta2, double weight_decay,
                                        double eps, const at::Tensor *grad_scale, char *err,
                                        size_t err_len) {
  try {
    std::optional<at::Tensor> scale;
    if (grad_scale != nullptr) {
      scale = *grad_scale;
    }
    at::_fused_adamw_({*param}, {*grad}, {*exp_avg}, {*exp_avg_sq}, {}, {*step}, lr, beta1,
                      beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false, scale,
                      /*found_inf=*/std::nullopt);
    return 0;
  } catch (const std::exception &e) {
    std::snprintf(err, err_len, "%s", e.what());
    return 1;
  }
}
