// CUDA fused optimizer steps: many parameters per launch (multi_tensor.cuh); the per-element math is
// core/kernels/math.h, shared with the CPU.
#include <array>
#include <utility>

#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/math.h"
#include "core/kernels/multi_tensor.cuh"
#include "core/kernels/optimizer.h"

namespace dpe::kernels {
namespace {

using detail::block_chunk;
using detail::BlockChunk;
using detail::for_each_tensor_list;
using detail::kBlock;
using detail::TensorList;

static_assert(kFusedTensorsPerLaunch == detail::kMaxTensorsPerLaunch);

// arrays: param, grad, momentum buffer (null without momentum).
template <typename Flags, typename T>
__global__ void sgd_step_kernel(const TensorList<T, 3> list, T lr, T momentum, T dampening_complement,
                                T weight_decay) {
  const BlockChunk c = block_chunk(list);
  T* param = list.arrays[0][c.t];
  const T* grad = list.arrays[1][c.t];
  T* buf = list.arrays[2][c.t];
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    param[i] = sgd_updated_param<Flags>(param[i], grad[i], Flags::momentum ? buf + i : nullptr, lr, momentum,
                                        dampening_complement, weight_decay);
  }
}

// arrays: param, grad, exp_avg, exp_avg_sq.
template <typename T>
__global__ void adam_step_kernel(const TensorList<T, 4> list, AdamConstants<T> constants) {
  const BlockChunk c = block_chunk(list);
  T* param = list.arrays[0][c.t];
  const T* grad = list.arrays[1][c.t];
  T* exp_avg = list.arrays[2][c.t];
  T* exp_avg_sq = list.arrays[3][c.t];
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    param[i] = adam_updated_param(param[i], grad[i], exp_avg + i, exp_avg_sq + i, constants);
  }
}

}  // namespace

void sgd_step_cuda(cudaStream_t stream, DType dtype, std::span<const SgdTensor> tensors, const SgdStep& step) {
  for (const SgdTensor& t : tensors) {
    detail::check_n("sgd_step_cuda", t.n);
    DPE_INTERNAL_ASSERT(t.n == 0 || step.momentum == 0 || t.momentum_buffer != nullptr,
                        "sgd_step_cuda: momentum without a buffer");
  }
  detail::dispatch_compute_type(dtype, "sgd_step_cuda", [&](auto tag) {
    using T = decltype(tag);
    const T weight_decay = static_cast<T>(step.weight_decay);
    dispatch_sgd_flags(step.momentum != 0, step.first_step, step.nesterov, weight_decay != T(0), [&](auto flags) {
      for_each_tensor_list<T, 3>(
          tensors,
          [&](const SgdTensor& t) {
            T* buf = step.momentum != 0 ? static_cast<T*>(t.momentum_buffer) : nullptr;
            return std::pair{t.n, std::array<T*, 3>{static_cast<T*>(t.param),
                                                    const_cast<T*>(static_cast<const T*>(t.grad)), buf}};
          },
          [&](const TensorList<T, 3>& list, unsigned blocks) {
            sgd_step_kernel<decltype(flags), T><<<blocks, kBlock, 0, stream>>>(
                list, static_cast<T>(step.lr), static_cast<T>(step.momentum), static_cast<T>(1.0 - step.dampening),
                weight_decay);
            DPE_CUDA_CHECK_LAUNCH();
          });
    });
  });
}

void sgd_step_cuda(cudaStream_t stream, DType dtype, int64_t n, void* param, const void* grad, void* momentum_buffer,
                   const SgdStep& step) {
  const SgdTensor t{.n = n, .param = param, .grad = grad, .momentum_buffer = momentum_buffer};
  sgd_step_cuda(stream, dtype, std::span<const SgdTensor>(&t, 1), step);
}

void adam_step_cuda(cudaStream_t stream, DType dtype, std::span<const AdamTensor> tensors, const AdamStep& step) {
  for (const AdamTensor& t : tensors) detail::check_n("adam_step_cuda", t.n);
  detail::dispatch_compute_type(dtype, "adam_step_cuda", [&](auto tag) {
    using T = decltype(tag);
    const AdamConstants<T> constants = adam_constants<T>(step.lr, step.beta1, step.beta2, step.eps,
                                                         step.weight_decay, step.decoupled, step.step);
    for_each_tensor_list<T, 4>(
        tensors,
        [&](const AdamTensor& t) {
          return std::pair{t.n, std::array<T*, 4>{static_cast<T*>(t.param),
                                                  const_cast<T*>(static_cast<const T*>(t.grad)),
                                                  static_cast<T*>(t.exp_avg), static_cast<T*>(t.exp_avg_sq)}};
        },
        [&](const TensorList<T, 4>& list, unsigned blocks) {
          adam_step_kernel<T><<<blocks, kBlock, 0, stream>>>(list, constants);
          DPE_CUDA_CHECK_LAUNCH();
        });
  });
}

}  // namespace dpe::kernels
