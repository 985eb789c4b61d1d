// Reductions over one axis. x is contiguous, viewed as (outer, size, inner); the axis is `size`.
// A full reduction is outer = inner = 1. dtype is float32 or float64.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/kernels/backend_types.h"
#include "core/kernels/op_enums.h"

namespace dpe::kernels {

// x: (outer, size, inner)  y: (outer, inner). Mean divides the sum by size. Sum of size 0 is 0;
// the caller rejects Max/Min/Mean over an empty axis. Accumulation is in the compute type, blocked/pairwise
// for accuracy, so CPU and CUDA agree to a few ulps times log(size).
void reduce_cpu(AxisReduction op, DType dtype, int64_t outer, int64_t size, int64_t inner, const void* x, void* y);
void reduce_cuda(cudaStream_t stream, AxisReduction op, DType dtype, int64_t outer, int64_t size, int64_t inner,
                 const void* x, void* y);

// x: (outer, size, inner)  indices: (outer, inner) int64: the first index of the maximum (size >= 1).
// NaN counts as the maximum (like PyTorch).
void argmax_cpu(DType dtype, int64_t outer, int64_t size, int64_t inner, const void* x, int64_t* indices);
void argmax_cuda(cudaStream_t stream, DType dtype, int64_t outer, int64_t size, int64_t inner, const void* x,
                 int64_t* indices);

// out[i] = op over k, in order, of inputs[k][i], for every dtype: a collective's sum (Sum), avg (Mean), max and
// min on one GPU, with the semantics of collectives/reduce_buffers.h's host twin (integer Mean divides the sum
// as integers; 16-bit floats are combined in float32 and rounded once; NaN loses Max/Min unless it came
// first, like std::max). inputs: device pointers on the stream's GPU, each of `count` elements; out may alias
// any of them element for element. At most kMaxReduceBuffers inputs.
inline constexpr int kMaxReduceBuffers = 64;
void reduce_buffers_cuda(cudaStream_t stream, AxisReduction op, DType dtype, const std::vector<const void*>& inputs,
                         int64_t count, void* out);

}  // namespace dpe::kernels
