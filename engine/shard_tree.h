// The deterministic mode's fixed binary tree over virtual shards (engine/deterministic_step.cc): node [lo, hi)
// is the sum of its left child [lo, tree_split(lo, hi)), which takes the larger half, and its right child. Every
// addition's operands depend on the shard indices alone, so the sum has the same bits whichever devices hold
// the shards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace dpe {

inline size_t tree_split(size_t lo, size_t hi) { return lo + (hi - lo + 1) / 2; }

// For every output m and element i in [0, count): out[m][i] = the tree's sum of in[0][i] ... in[k - 1][i], each
// addition rounded to `dtype` (float32 or float64): the bits of adding the tensors pairwise in that tree. Host
// pointers (any CPU device's memory); outputs must not alias inputs. Thread-safety: none needed beyond the
// caller's (reads the inputs, writes only the outputs' [0, count)).
void tree_sum_buffers_cpu(DType dtype, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                          int64_t count);

}  // namespace dpe
