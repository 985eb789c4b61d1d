// Random fills from a counter-based generator (Philox-4x32-10, core/kernels/philox.h): element i of a fill
// with (seed, offset) depends only on (seed, offset + i), so CPU and CUDA produce the same numbers and a
// tensor can be filled in parallel in any order. dtype is float32 or float64; out is contiguous.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernels/backend_types.h"

namespace dpe::kernels {

struct PhiloxState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // counter of the first element
};

// Uniform in [low, high).
void uniform_cpu(DType dtype, int64_t n, PhiloxState state, double low, double high, void* out);
void uniform_cuda(cudaStream_t stream, DType dtype, int64_t n, PhiloxState state, double low, double high, void* out);

// Normal(mean, std), Box-Muller.
void normal_cpu(DType dtype, int64_t n, PhiloxState state, double mean, double std, void* out);
void normal_cuda(cudaStream_t stream, DType dtype, int64_t n, PhiloxState state, double mean, double std, void* out);

// 1 with probability p, else 0 (dropout masks).
void bernoulli_cpu(DType dtype, int64_t n, PhiloxState state, double p, void* out);
void bernoulli_cuda(cudaStream_t stream, DType dtype, int64_t n, PhiloxState state, double p, void* out);

}  // namespace dpe::kernels
