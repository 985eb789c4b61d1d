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
// PyTorch's foreach SGD. CPU: one after another. CUDA: a single launch for up to kFusedTensorsPerLaunch
// parameters (a step of a small model is otherwise one launch per parameter, and launch-bound). Every element
// is updated by the same expression as the one-tensor step, so the results are bitwise the same.
inline constexpr int kFusedTensorsPerLaunch = 48;
void sgd_step_cpu(DType dtype, std::span<const SgdTensor> tensors, const SgdStep& step);
void sgd_step_cuda(cudaStream_t stream, DType dtype, std::span<const SgdTensor> tensors, const SgdStep& step);

// One Adam or AdamW step (PyTorch 1.13's single-tensor update, core/kernels/math.h's adam_updated_param) of
// parameters that share dtype, device and step count, each with its two moment buffers: one pass over the four
// arrays where the tensor ops made about ten; on CUDA one launch for up to kFusedTensorsPerLaunch parameters.
struct AdamStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = false;  // AdamW: p *= 1 - lr * weight_decay, instead of weight_decay * p added to the gradient
  double step = 1;         // this step's number (1 for the first), for the bias corrections
};
struct AdamTensor {
  int64_t n = 0;
  void* param = nullptr;
  const void* grad = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
};
void adam_step_cpu(DType dtype, std::span<const AdamTensor> tensors, const AdamStep& step);
void adam_step_cuda(cudaStream_t stream, DType dtype, std::span<const AdamTensor> tensors, const AdamStep& step);

}  // namespace dpe::kernels
