// PyTorch's multi_tensor_apply in small (include from .cu files only): one launch updates up to
// kMaxTensorsPerLaunch tensors' element-wise arrays (a parameter, its gradient, its optimizer state), where a
// launch per tensor made a small model's optimizer step launch-bound (docs/BENCHMARKS.md, "the CNN's step is
// host-bound").
//
// Layout: the tensors travel by value in the kernel's argument (TensorList, under 2.5 KB for four arrays,
// within the 4 KB every architecture takes). Each block owns kMultiTensorChunk consecutive elements of one
// tensor: tensor t owns blocks [first_block[t], first_block[t + 1]); first_block[count] is the grid size.
// Empty tensors take no block.
#pragma once

#include <cstdint>

#include "core/error.h"
#include "core/kernels/cuda_launch.cuh"

namespace dpe::kernels::detail {

inline constexpr int kMaxTensorsPerLaunch = 48;
// Elements per block: each of kBlock threads takes 8 of them, kBlock apart (coalesced).
inline constexpr int64_t kMultiTensorChunk = int64_t(kBlock) * 8;
// At most this many blocks per launch (the grid's x limit is 2^31 - 1): more tensors start another launch.
inline constexpr int64_t kMultiTensorMaxBlocks = int64_t(1) << 30;

// kArrays arrays of n[t] elements of T for each of `count` tensors.
template <typename T, int kArrays>
struct TensorList {
  int count = 0;
  int64_t n[kMaxTensorsPerLaunch];
  T* arrays[kArrays][kMaxTensorsPerLaunch];
  int64_t first_block[kMaxTensorsPerLaunch + 1];
};

// The calling block's tensor and its elements [begin, end).
struct BlockChunk {
  int t;
  int64_t begin, end;
};

template <typename T, int kArrays>
__device__ BlockChunk block_chunk(const TensorList<T, kArrays>& list) {
  // The last t with first_block[t] <= blockIdx.x: a binary search (first_block[0] = 0 <= every block).
  const int64_t block = blockIdx.x;
  int lo = 0, hi = list.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (list.first_block[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t begin = (block - list.first_block[lo]) * kMultiTensorChunk;
  return {lo, begin, min(list.n[lo], begin + kMultiTensorChunk)};
}

// Fills TensorLists from `tensors` (arrays_of(tensor) returns {n, {kArrays pointers}}) and calls
// launch(list, blocks) for each full one and the rest: as few launches as the limits above allow.
template <typename T, int kArrays, typename Tensors, typename ArraysOf, typename Launch>
void for_each_tensor_list(const Tensors& tensors, ArraysOf arrays_of, Launch launch) {
  TensorList<T, kArrays> list;
  list.first_block[0] = 0;
  auto flush = [&] {
    if (list.count == 0) return;
    launch(list, static_cast<unsigned>(list.first_block[list.count]));
    list.count = 0;
  };
  for (const auto& tensor : tensors) {
    const auto [n, arrays] = arrays_of(tensor);
    if (n == 0) continue;
    const int64_t blocks = (n + kMultiTensorChunk - 1) / kMultiTensorChunk;
    DPE_INTERNAL_ASSERT(blocks <= kMultiTensorMaxBlocks, "multi-tensor launch: ", n, " elements in one tensor");
    if (list.count == kMaxTensorsPerLaunch || list.first_block[list.count] + blocks > kMultiTensorMaxBlocks) {
      flush();
    }
    const int k = list.count++;
    list.n[k] = n;
    for (int a = 0; a < kArrays; ++a) list.arrays[a][k] = arrays[a];
    list.first_block[k + 1] = list.first_block[k] + blocks;
  }
  flush();
}

}  // namespace dpe::kernels::detail
