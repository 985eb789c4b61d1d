// CPU fused optimizer steps. The per-element math is core/kernels/math.h (shared with CUDA); this file
// loops. Elements are independent, so results do not depend on how tbb splits the range.
#include "core/error.h"
#include "core/kernels/arg_checks.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/dtype_dispatch.h"
#include "core/kernels/math.h"
#include "core/kernels/optimizer.h"

namespace dpe::kernels {

void sgd_step_cpu(DType dtype, int64_t n, void* param, const void* grad, void* momentum_buffer, const SgdStep& step) {
  detail::check_n("sgd_step_cpu", n);
  if (n == 0) return;
  DPE_INTERNAL_ASSERT(step.momentum == 0 || momentum_buffer != nullptr, "sgd_step_cpu: momentum without a buffer");
  detail::dispatch_float(dtype, "sgd_step_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* ps = static_cast<T*>(param);
    const T* gs = static_cast<const T*>(grad);
    T* bufs = step.momentum != 0 ? static_cast<T*>(momentum_buffer) : nullptr;
    const T lr = static_cast<T>(step.lr), momentum = static_cast<T>(step.momentum);
    const T dampening_complement = static_cast<T>(1.0 - step.dampening);
    const T weight_decay = static_cast<T>(step.weight_decay);
    dispatch_sgd_flags(bufs != nullptr, step.first_step, step.nesterov, weight_decay != T(0), [&](auto flags) {
      using Flags = decltype(flags);
      detail::parallel_range(n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          ps[i] = sgd_updated_param<Flags>(ps[i], gs[i], Flags::momentum ? bufs + i : nullptr, lr, momentum,
                                           dampening_complement, weight_decay);
        }
      });
    });
  });
}

void sgd_step_cpu(DType dtype, std::span<const SgdTensor> tensors, const SgdStep& step) {
  for (const SgdTensor& t : tensors) sgd_step_cpu(dtype, t.n, t.param, t.grad, t.momentum_buffer, step);
}

void adam_step_cpu(DType dtype, std::span<const AdamTensor> tensors, const AdamStep& step) {
  detail::dispatch_float(dtype, "adam_step_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const AdamConstants<T> c = adam_constants<T>(step.lr, step.beta1, step.beta2, step.eps, step.weight_decay,
                                                 step.decoupled, step.step);
    for (const AdamTensor& t : tensors) {
      detail::check_n("adam_step_cpu", t.n);
      T* ps = static_cast<T*>(t.param);
      const T* gs = static_cast<const T*>(t.grad);
      T* ms = static_cast<T*>(t.exp_avg);
      T* vs = static_cast<T*>(t.exp_avg_sq);
      detail::parallel_range(t.n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) ps[i] = adam_updated_param(ps[i], gs[i], ms + i, vs + i, c);
      });
    }
  });
}

}  // namespace dpe::kernels
