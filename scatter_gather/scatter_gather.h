// scatter and gather along a batch dimension, differentiable (PyTorch's Scatter/Gather autograd functions).
//
// scatter(x, devices, dim, sizes): chunk i = x.narrow(dim, offset_i, sizes[i]) copied to devices[i]
// (a chunk already on its device is a view, not a copy). Backward: the chunks' gradients are gathered back
// to x's device, concatenated along dim (a chunk without gradient contributes zeros).
// gather(tensors, output_device, dim): concatenation on output_device, in list order. Backward: the
// gradient is split along dim and each piece sent back to its tensor's device. Shapes must agree outside
// dim (the error names both shapes). 0-dim inputs are unsqueezed into a vector of length n with a one-time
// warning on stderr, like PyTorch.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace dpe {

std::vector<Tensor> scatter(const Tensor& x, const std::vector<Device>& devices, int64_t dim,
                            const std::vector<int64_t>& chunk_sizes);

Tensor gather(const std::vector<Tensor>& tensors, const Device& output_device, int64_t dim = 0);

}  // namespace dpe
