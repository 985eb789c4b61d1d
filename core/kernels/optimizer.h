// Fused optimizer steps: one pass over a parameter, its gradient and its state, where the unfused tensor
// ops make several (the SGD-momentum step reads and writes 5 arrays instead of 8; it is memory-bound).
#pragma once

#include <cstdint>
#include <span>

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

// One parameter of a multi-tensor step: (n) contiguous elements in each array; momentum_buffer null without
// momentum.
struct SgdTensor {
  int64_t n = 0;
  void* param = nullptr;
  const void* grad = nullptr;
  void* momentum_buffer = nullptr;
};

// The step over several parameters of one device and dtype with the same `step` (first_step included):
// PyTorch's foreach SGD. CPU: one after another. CUDA: a single launch for up to kSgdTensorsPerLaunch
// parameters (a step of a small model is otherwise one launch per parameter, and launch-bound). Every element
// is updated by the same expression as the one-tensor step, so the results are bitwise the same.
inline constexpr int kSgdTensorsPerLaunch = 48;
void sgd_step_cpu(DType dtype, std::span<const SgdTensor> tensors, const SgdStep& step);
void sgd_step_cuda(cudaStream_t stream, DType dtype, std::span<const SgdTensor> tensors, const SgdStep& step);

}  // namespace dpe::kernels
