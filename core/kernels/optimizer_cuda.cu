// CUDA fused optimizer steps; the per-element math is core/kernels/math.h, shared with the CPU.
#include <algorithm>

#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/math.h"
#include "core/kernels/optimizer.h"

namespace dpe::kernels {
namespace {

// Elements per block: each of kBlock threads updates kItemsPerThread of them (strided by kBlock).
constexpr int kItemsPerThread = 8;
constexpr int64_t kChunk = int64_t(detail::kBlock) * kItemsPerThread;
// At most this many blocks per launch (the grid's x limit is 2^31 - 1): more tensors start another launch.
constexpr int64_t kMaxBlocksPerLaunch = int64_t(1) << 30;

// Up to kSgdTensorsPerLaunch parameters, passed by value as the kernel's argument (under 2 KB, within the 4 KB
// every architecture takes). Tensor t owns blocks [first_block[t], first_block[t + 1]), one per kChunk
// elements; first_block[count] is the grid size.
template <typename T>
struct SgdLaunch {
  int count = 0;
  int64_t n[kSgdTensorsPerLaunch];
  T* param[kSgdTensorsPerLaunch];
  const T* grad[kSgdTensorsPerLaunch];
  T* buf[kSgdTensorsPerLaunch];  // null without momentum
  int64_t first_block[kSgdTensorsPerLaunch + 1];
};

template <typename Flags, typename T>
__global__ void sgd_step_kernel(const SgdLaunch<T> a, T lr, T momentum, T dampening_complement, T weight_decay) {
  // The block's tensor: the last t with first_block[t] <= blockIdx.x (binary search; no tensor is empty).
  const int64_t block = blockIdx.x;
  int lo = 0, hi = a.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.first_block[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int t = lo;
  const int64_t begin = (block - a.first_block[t]) * kChunk;
  const int64_t end = min(a.n[t], begin + kChunk);
  T* param = a.param[t];
  const T* grad = a.grad[t];
  T* buf = a.buf[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    param[i] = sgd_updated_param<Flags>(param[i], grad[i], Flags::momentum ? buf + i : nullptr, lr, momentum,
                                        dampening_complement, weight_decay);
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
      SgdLaunch<T> a;
      a.first_block[0] = 0;
      auto launch = [&] {
        if (a.count == 0) return;
        sgd_step_kernel<decltype(flags), T><<<static_cast<unsigned>(a.first_block[a.count]), detail::kBlock, 0,
                                              stream>>>(a, static_cast<T>(step.lr), static_cast<T>(step.momentum),
                                                        static_cast<T>(1.0 - step.dampening), weight_decay);
        DPE_CUDA_CHECK_LAUNCH();
        a.count = 0;
      };
      for (const SgdTensor& t : tensors) {
        if (t.n == 0) continue;
        const int64_t blocks = (t.n + kChunk - 1) / kChunk;
        DPE_INTERNAL_ASSERT(blocks <= kMaxBlocksPerLaunch, "sgd_step_cuda: ", t.n, " elements in one tensor");
        if (a.count == kSgdTensorsPerLaunch || a.first_block[a.count] + blocks > kMaxBlocksPerLaunch) launch();
        const int k = a.count++;
        a.n[k] = t.n;
        a.param[k] = static_cast<T*>(t.param);
        a.grad[k] = static_cast<const T*>(t.grad);
        a.buf[k] = step.momentum != 0 ? static_cast<T*>(t.momentum_buffer) : nullptr;
        a.first_block[k + 1] = a.first_block[k] + blocks;
      }
      launch();
    });
  });
}

void sgd_step_cuda(cudaStream_t stream, DType dtype, int64_t n, void* param, const void* grad, void* momentum_buffer,
                   const SgdStep& step) {
  const SgdTensor t{.n = n, .param = param, .grad = grad, .momentum_buffer = momentum_buffer};
  sgd_step_cuda(stream, dtype, std::span<const SgdTensor>(&t, 1), step);
}

}  // namespace dpe::kernels
