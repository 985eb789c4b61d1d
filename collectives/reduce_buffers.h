// The arithmetic of the reducing collectives on host memory: out[m][i] = op over k of in[k][i], for every
// output m. Outputs may alias inputs element for element (an in-place all-reduce writes the result back
// into every member's buffer): the kernel reads all inputs of a block before it writes any output.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace dpe {

enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);

// Host pointers to `count` elements of `dtype` each. Avg divides the sum by inputs.size() (integer
// division for integer dtypes, like NCCL's ncclAvg). 16-bit floats are reduced in float32 and rounded once.
void reduce_buffers_cpu(DType dtype, ReduceOp op, const std::vector<const void*>& inputs,
                        const std::vector<void*>& outputs, int64_t count);

// out[m][i] = sum over k, in order, of scales[k] x in[k][i], each product rounded to `dtype` on its own (as a
// scaled copy followed by a sum rounds it), for float32 and float64 (anything else throws an internal error).
// Outputs may alias inputs as above. outputs[local] is the calling member's own, the one this thread's core
// reads next; with two members the other one is written past the caches (Note [Streaming the partner's
// sums] in reduce_buffers.cc), and every store is visible to other threads when the call returns.
void weighted_sum_buffers_cpu(DType dtype, const std::vector<const void*>& inputs, const std::vector<double>& scales,
                              const std::vector<void*>& outputs, size_t local, int64_t count);

}  // namespace dpe
