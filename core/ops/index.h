// Gathering rows by int64 indices: index_select and embedding (PyTorch names and semantics).
//
// Gradients: the backward scatter-adds the output gradient into a zero tensor of the input's shape
// (core/kernels/index.h index_add): deterministic on CPU; on CUDA by atomicAdd, so with repeated indices the
// last bits of a float sum may vary between runs.
#pragma once

#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace dpe {

// x: (..., V at dim, ...)  indices: (n) or 0-dim, int64 in [0, V)  ->  (..., n at dim, ...)
// An out-of-range index is an error naming it and V. Differentiable in x.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& indices);

// weight: (V, D)  indices: int64 of any shape, values in [0, V)  ->  (*indices.shape, D)
// padding_idx (may be negative: counts from V, like PyTorch) names a row whose gradient is always zero
// (its forward value is whatever the row holds; nn::Embedding zeroes it at initialisation).
Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx = std::nullopt);

}  // namespace dpe
