// reduce_buffers_cuda (core/kernels/reduce.h): the peer-copy backend's arithmetic, for every dtype. One thread
// per element combines the inputs in order, so the result is what reduce_buffers_cpu computes.
#include <cstdint>

#include "core/kernels/arg_checks.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/dtype_dispatch.h"
#include "core/kernels/reduce.h"

namespace dpe::kernels {
namespace {

using detail::first_index;
using detail::grid_for;
using detail::grid_stride;
using detail::kBlock;

// Passed by value (kernel parameters): no device allocation for the pointer list.
struct BufferList {
  const void* ptr[kMaxReduceBuffers];
  int n;
};

// The accumulation type: float for the 16-bit floats, the storage type otherwise.
template <typename T>
struct Acc {
  using type = T;
  static __device__ T load(T v) { return v; }
  static __device__ T store(T v) { return v; }
};
template <>
struct Acc<Half> {
  using type = float;
  static __device__ float load(Half v) { return half_to_float(v); }
  static __device__ Half store(float v) { return float_to_half(v); }
};
template <>
struct Acc<BFloat16> {
  using type = float;
  static __device__ float load(BFloat16 v) { return bfloat16_to_float(v); }
  static __device__ BFloat16 store(float v) { return float_to_bfloat16(v); }
};

template <typename T, AxisReduction op>
__global__ void reduce_buffers_kernel(BufferList in, int64_t count, T* out) {
  using A = typename Acc<T>::type;
  for (int64_t i = first_index(); i < count; i += grid_stride()) {
    A acc = Acc<T>::load(static_cast<const T*>(in.ptr[0])[i]);
    for (int k = 1; k < in.n; ++k) {
      const A v = Acc<T>::load(static_cast<const T*>(in.ptr[k])[i]);
      if constexpr (op == AxisReduction::Max) {
        acc = acc < v ? v : acc;  // std::max's choice, as the host twin makes it
      } else if constexpr (op == AxisReduction::Min) {
        acc = v < acc ? v : acc;
      } else {
        acc = static_cast<A>(acc + v);
      }
    }
    if constexpr (op == AxisReduction::Mean) acc = static_cast<A>(acc / static_cast<A>(in.n));
    out[i] = Acc<T>::store(acc);
  }
}

}  // namespace

void reduce_buffers_cuda(cudaStream_t stream, AxisReduction op, DType dtype, const std::vector<const void*>& inputs,
                         int64_t count, void* out) {
  detail::check_n("reduce_buffers_cuda", count);
  DPE_CHECK(!inputs.empty() && inputs.size() <= static_cast<size_t>(kMaxReduceBuffers),
            "reduce_buffers_cuda: ", inputs.size(), " inputs; expected 1 to ", kMaxReduceBuffers);
  if (count == 0) return;
  BufferList list{};
  list.n = static_cast<int>(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) list.ptr[k] = inputs[k];
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    detail::dispatch_op<AxisReduction::Sum, AxisReduction::Mean, AxisReduction::Max, AxisReduction::Min>(
        op, [&](auto op_constant) {
          reduce_buffers_kernel<T, decltype(op_constant)::value>
              <<<grid_for(count), kBlock, 0, stream>>>(list, count, static_cast<T*>(out));
        });
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpe::kernels
