#include "engine/shard_tree.h"

#include <algorithm>

#include "core/error.h"

namespace dpe {

namespace {

// Small enough that a block of every tree level stays in L1 while the inputs stream through once.
constexpr int64_t kBlock = 1024;

// acc[0, len) = node [lo, hi)'s sum at `start`; scratch holds a block per level below.
template <typename T>
void tree_block(const std::vector<const void*>& inputs, size_t lo, size_t hi, int64_t start, int64_t len, T* acc,
                T* scratch) {
  const T* first = static_cast<const T*>(inputs[lo]) + start;
  if (hi - lo == 1) {
    std::copy(first, first + len, acc);
    return;
  }
  if (hi - lo == 2) {
    const T* second = static_cast<const T*>(inputs[lo + 1]) + start;
    for (int64_t i = 0; i < len; ++i) acc[i] = first[i] + second[i];
    return;
  }
  const size_t mid = tree_split(lo, hi);
  tree_block(inputs, lo, mid, start, len, acc, scratch);
  tree_block(inputs, mid, hi, start, len, scratch, scratch + kBlock);
  for (int64_t i = 0; i < len; ++i) acc[i] += scratch[i];
}

template <typename T>
void tree_sum(const std::vector<const void*>& inputs, const std::vector<void*>& outputs, int64_t count) {
  size_t levels = 1;
  for (size_t width = inputs.size(); width > 1; width = (width + 1) / 2) ++levels;
  std::vector<T> blocks(static_cast<size_t>(kBlock) * levels);
  for (int64_t start = 0; start < count; start += kBlock) {
    const int64_t len = std::min(kBlock, count - start);
    tree_block(inputs, 0, inputs.size(), start, len, blocks.data(), blocks.data() + kBlock);
    for (void* out : outputs) std::copy(blocks.data(), blocks.data() + len, static_cast<T*>(out) + start);
  }
}

}  // namespace

void tree_sum_buffers_cpu(DType dtype, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                          int64_t count) {
  DPE_INTERNAL_ASSERT(!inputs.empty() && count >= 0);
  switch (dtype) {
    case DType::Float32: return tree_sum<float>(inputs, outputs, count);
    case DType::Float64: return tree_sum<double>(inputs, outputs, count);
    default: DPE_INTERNAL_ASSERT(false, "tree_sum_buffers_cpu: no kernel for ", dtype);
  }
}

}  // namespace dpe
