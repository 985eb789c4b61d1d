// How a batch of B items is split across n devices.
//
//   Chunk    (default, PyTorch's tensor.chunk): size ceil(B/n), the last smaller, possibly fewer than n
//            chunks: 5/3 -> 2,2,1; 4/3 -> 2,2; 9/4 -> 3,3,3; 10/4 -> 3,3,3,1; 1/8 -> 1.
//   Balanced (tensor_split / MXNet even_split=False): the first B % n chunks get one more, no empty chunk
//            when B >= n: 4/3 -> 2,1,1; 10/4 -> 3,3,2,2.
//   Weighted: proportional to weights (largest remainders get the leftover items, ties to lower index).
//   Auto:     the engine's: weights re-solved from each device's measured speed (scatter_gather/auto_split.h);
//             compute_chunk_sizes refuses it.
// Trailing empty chunks are dropped (the devices after the last non-empty chunk are not used), and B = 0 gives
// one empty chunk; an empty chunk before a non-empty one keeps its place (weights {3, 0, 1}: 3, 0, 1), so
// chunk i is always device i's. The result has at most n entries (Chunk, Balanced: at most min(B, n)), and
// they sum to B exactly, for any B up to INT64_MAX (no
// intermediate overflows; the weighted rule's floating-point shares are clamped and corrected so rounding
// never makes them sum above B, and leftover items only go to positive weights).
// Errors (dpe::Error): B < 0, n < 1; for Weighted a weight count other than n, a weight that is NaN, infinite
// or negative (naming its index and value), weights summing to 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpe {

enum class SplitRule { Chunk, Balanced, Weighted, Auto };

std::string split_rule_name(SplitRule rule);

// The Weighted rule's sizes, one per weight in order, zeros kept (compute_chunk_sizes drops the trailing ones):
// `batch` items proportional to the weights, largest remainders taking the leftover (ties to lower index,
// only positive weights). Same errors as the Weighted rule's.
std::vector<int64_t> apportion(int64_t batch, const std::vector<double>& weights);

// The chunk sizes, in device order; weights are used (and required: one per device, non-negative, positive
// sum) only by Weighted.
std::vector<int64_t> compute_chunk_sizes(int64_t batch, int64_t num_devices, SplitRule rule = SplitRule::Chunk,
                                         const std::vector<double>& weights = {});

// Where each chunk starts: offsets[i] = sizes[0] + ... + sizes[i - 1]; chunk i is rows
// [offsets[i], offsets[i] + sizes[i]) of the batch along the split dimension.
std::vector<int64_t> chunk_offsets(const std::vector<int64_t>& sizes);

}  // namespace dpe
