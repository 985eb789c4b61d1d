// CPU nll gather/scatter (core/kernels/nll.h). Sequential: one pass over (outer, inner) positions, O(1) work
// each, so parallelism would not pay for itself at loss sizes. Targets are checked here (the contract in
// nll.h): the first out-of-range target throws before anything is written.
#include <algorithm>

#include "core/error.h"
#include "core/kernels/arg_checks.h"
#include "core/kernels/dtype_dispatch.h"
#include "core/kernels/nll.h"

namespace dpe::kernels {
namespace {

void check_targets(const char* what, int64_t n, int64_t classes, const int64_t* target, int64_t ignore_index) {
  for (int64_t k = 0; k < n; ++k) {
    const int64_t t = target[k];
    DPE_CHECK(t == ignore_index || (t >= 0 && t < classes), what, ": target ", t, " is out of bounds for ", classes,
              " classes (expected a value in [0, ", classes, ") or ignore_index ", ignore_index, ")");
  }
}

}  // namespace

// log_probs: (outer, classes, inner)  target, loss, valid: (outer, inner)
void nll_forward_cpu(DType dtype, int64_t outer, int64_t classes, int64_t inner, const void* log_probs,
                     const int64_t* target, int64_t ignore_index, void* loss, void* valid) {
  detail::check_axis_dims("nll_forward_cpu", outer, classes, inner);
  const int64_t n = outer * inner;
  check_targets("nll_forward_cpu", n, classes, target, ignore_index);
  detail::dispatch_float(dtype, "nll_forward_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* lp = static_cast<const T*>(log_probs);
    T* out = static_cast<T*>(loss);
    T* mask = static_cast<T*>(valid);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = o * inner + i;
        const int64_t t = target[k];
        const bool ok = t != ignore_index;
        out[k] = ok ? -lp[(o * classes + t) * inner + i] : T(0);
        mask[k] = ok ? T(1) : T(0);
      }
    }
  });
}

// target, grad_loss: (outer, inner)  grad_log_probs: (outer, classes, inner)
void nll_backward_cpu(DType dtype, int64_t outer, int64_t classes, int64_t inner, const int64_t* target,
                      int64_t ignore_index, const void* grad_loss, void* grad_log_probs) {
  detail::check_axis_dims("nll_backward_cpu", outer, classes, inner);
  const int64_t n = outer * inner;
  check_targets("nll_backward_cpu", n, classes, target, ignore_index);
  detail::dispatch_float(dtype, "nll_backward_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = static_cast<const T*>(grad_loss);
    T* dx = static_cast<T*>(grad_log_probs);
    std::fill(dx, dx + outer * classes * inner, T(0));
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = o * inner + i;
        const int64_t t = target[k];
        if (t != ignore_index) dx[(o * classes + t) * inner + i] = -g[k];
      }
    }
  });
}

}  // namespace dpe::kernels
