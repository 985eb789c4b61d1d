// Fused optimizer steps: one pass over a parameter, its gradient and its state, where the unfused tensor
// ops make several (the SGD-momentum step reads and writes 5 arrays instead of 8; it is memory-bound).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernels/backend_types.h"

namespace dpe::kernels {

struct SgdStep {
  double lr = 0;
  double momentum = 0;  // 0: momentum_buffer is unused and may be null
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer is written (= the first direction), not read
};

// param, grad, momentum_buffer: (n) contiguous arrays of dtype (float32 or float64); param and
// momentum_buffer are updated in place. Hyper-parameters are rounded to dtype first (like the unfused ops).
void sgd_step_cpu(DType dtype, int64_t n, void* param, const void* grad, void* momentum_buffer, const SgdStep& step);
void sgd_step_cuda(cudaStream_t stream, DType dtype, int64_t n, void* param, const void* grad, void* momentum_buffer,
                   const SgdStep& step);

}  // namespace dpe::kernels
