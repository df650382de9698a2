// One AdamW step with libtorch's fused kernel (`_fused_adamw_`, which tch does not bind): the
// worker's optimizer wherever its own kernels do not run, and their reference. Called from
// stage-worker/src/model/optim.rs.
//
// Tensors arrive as tch's handles (`at::Tensor *`). Returns 0, or 1 with a message in `err`
// (a libtorch exception must not unwind into Rust).
#include <ATen/core/Tensor.h>
#include <ATen/ops/_fused_adamw.h>

#include <cstdio>
#include <exception>
#include <optional>

// The update with no flat gradient: each parameter's own gradient (as autograd left it)
// goes to the kernel in a list, next to the matching slices of the flat parameter and moment
// buffers, so no gradient is copied, zeroed or accumulated into another buffer. The global
// gradient norm (for clipping) comes from `_foreach_norm`.
// Afterwards every gradient is dropped (the next backward pass hands its fresh gradients over
// without a copy). `leaves[i]` is parameter i, laid out at `offsets[i]` in `flat`; those
// below `decay_len` take `weight_decay`, the rest none. On success `*norm_out` is a new
// tensor handle (the norm before clipping) that the caller owns.
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <vector>

extern "C" int stage_worker_adamw_lists(const at::Tensor *const *leaves, const int64_t *offsets,
                                        size_t n, const at::Tensor *flat,
                                        const at::Tensor *exp_avg, const at::Tensor *exp_avg_sq,
                                        int64_t decay_len, const at::Tensor *step, double lr,
                                        double beta1, double beta2, double weight_decay,
                                        double eps, double clip_norm, at::Tensor **norm_out,
                                        char *err, size_t err_len) {
  try {
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> grads;
    grads.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      at::Tensor g = leaves[i]->grad();
      grads.push_back(g.defined() ? g.reshape({-1}) : at::zeros_like(*leaves[i]).reshape({-1}));
    }
    at::Tensor norm = at::linalg_vector_norm(at::stack(at::_foreach_norm(grads, 2)), 2);
    at::Tensor scale = norm.add(1e-6).mul(1.0 / clip_norm).clamp_min(1.0);
    for (int group = 0; group < 2; ++group) {
      std::vector<at::Tensor> ps, gs, ms, vs, steps;
      for (size_t i = 0; i < n; ++i) {
        bool decayed = offsets[i] < decay_len;
        if (decayed != (group == 0)) {
          continue;
        }
        int64_t len = grads[i].numel();
        ps.push_back(flat->narrow(0, offsets[i], len));
        gs.push_back(grads[i]);
        ms.push_back(exp_avg->narrow(0, offsets[i], len));
        vs.push_back(exp_avg_sq->narrow(0, offsets[i], len));
        steps.push_back(*step);
      }
      if (ps.empty()) {
        continue;
      }
      at::_fused_adamw_(ps, gs, ms, vs, {}, steps, lr, beta1, beta2,
                        group == 0 ? weight_decay : 0.0, eps, /*amsgrad=*/false,
                        /*maximize=*/false, scale, /*found_inf=*/std::nullopt);
    }
    for (size_t i = 0; i < n; ++i) {
      leaves[i]->mutable_grad().reset();
    }
    *norm_out = new at::Tensor(norm);
    return 0;
  } catch (const std::exception &e) {
    std::snprintf(err, err_len, "%s", e.what());
    return 1;
  }
}
