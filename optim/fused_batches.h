// How SGD and Adam hand their parameters to the fused kernels (core/kernels/optimizer.h): the parameters of a
// group that share a device, a dtype and a key (SGD: whether the momentum buffer is new; Adam: the step count)
// go in one call, which on a GPU is one launch for up to 48 of them (PyTorch's foreach). Internal to optim/.
#pragma once

#include <algorithm>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace dpe::optim::detail {

// The fused kernels' layout: t contiguous, float32 or float64, with p's dtype, device and shape.
inline bool fusable_with(const Tensor& t, const Tensor& p) {
  return t.is_contiguous() && t.dtype() == p.dtype() && t.device() == p.device() && t.shape() == p.shape() &&
         (p.dtype() == DType::Float32 || p.dtype() == DType::Float64);
}

// items: the kernel's per-parameter arrays (kernels::SgdTensor, kernels::AdamTensor); their tensors must
// outlive the batch's call.
template <typename Key, typename Item>
struct FusedBatch {
  Device device;
  DType dtype;
  Key key;
  std::vector<Item> items;
};

// Adds p's item to the batch of its device, dtype and key, making that batch if it is the first.
template <typename Key, typename Item>
void add_to_batch(std::vector<FusedBatch<Key, Item>>& batches, const Tensor& p, const Key& key, const Item& item) {
  auto it = std::find_if(batches.begin(), batches.end(), [&](const FusedBatch<Key, Item>& b) {
    return b.device == p.device() && b.dtype == p.dtype() && b.key == key;
  });
  if (it == batches.end()) it = batches.insert(batches.end(), FusedBatch<Key, Item>{p.device(), p.dtype(), key, {}});
  it->items.push_back(item);
}

}  // namespace dpe::optim::detail
