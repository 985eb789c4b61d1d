// How the CUDA batch-norm reductions cut each channel into pieces (Note [Batch-norm reductions on CUDA],
// batch_norm_cuda.cu): the cut and which values a block's thread visits; and the merge of parts' moments
// (Chan's update) and what the statistics pass writes besides mean and var (BatchNormStatsExtras), which the
// CPU's statistics use too (batch_norm_cpu.cc). Host-and-device, so the CPU tests check the same code the GPU
// runs. Private to core/kernels.
//
// Layout: a contiguous (N, C, S) tensor; channel c's M = N * S values, position i of the channel (0 <= i < M)
// being element (i / S, c, i % S).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/host_device.h"
#include "core/kernels/batch_norm.h"

namespace dpe::kernels::detail {

inline constexpr int64_t kBatchNormTargetBlocks = 512;   // enough blocks to fill a GPU
inline constexpr int64_t kBatchNormMinPerPiece = 4096;   // values per piece at least (16 per thread of 256)

// Each channel's M values cut into `pieces` ranges of `len` positions (the last may be shorter, none empty).
struct BatchNormSplit {
  int64_t pieces = 1, len = 0;
};

inline BatchNormSplit batch_norm_split(int64_t channels, int64_t m) {
  if (m == 0 || channels == 0) return {};
  const int64_t wanted = std::max<int64_t>(1, std::min((m + kBatchNormMinPerPiece - 1) / kBatchNormMinPerPiece,
                                                       (kBatchNormTargetBlocks + channels - 1) / channels));
  const int64_t len = (m + wanted - 1) / wanted;
  return {(m + len - 1) / len, len};
}

// Block `block`'s channel and its range [lo, hi) of the channel's positions (blocks: C * pieces).
struct BatchNormPiece {
  int64_t c, lo, hi;
};

DPE_HOST_DEVICE BatchNormPiece batch_norm_piece(int64_t block, BatchNormSplit split, int64_t m) {
  const int64_t c = block / split.pieces, lo = block % split.pieces * split.len;
  return {c, lo, lo + split.len < m ? lo + split.len : m};
}

// Calls f(element offset) for thread `thread` of `threads`: the piece's positions thread, thread + threads, ...
// in that order. The position's (n, s) advance by threads' quotient and remainder by S, so there is one
// division per thread, not per value.
template <typename F>
DPE_HOST_DEVICE void for_each_in_piece(const BatchNormPiece& p, int64_t channels, int64_t s, int64_t thread,
                                       int64_t threads, F f) {
  int64_t i = p.lo + thread;
  if (i >= p.hi) return;
  int64_t n = i / s, j = i - n * s;
  const int64_t dn = threads / s, dj = threads - dn * s;
  for (; i < p.hi; i += threads) {
    f((n * channels + p.c) * s + j);
    n += dn;
    j += dj;
    if (j >= s) {
      j -= s;
      ++n;
    }
  }
}

// The count, mean and sum of squared deviations from the mean of some values: one part's (a CUDA piece's), or
// of the parts merged so far by Chan et al.'s parallel update, merge(), in a fixed order.
struct RunningMoments {
  double count = 0, mean = 0, m2 = 0;

  // Adds a part of n > 0 values of mean part_mean and squared deviations part_m2.
  DPE_HOST_DEVICE void merge(double n, double part_mean, double part_m2) {
    const double total = count + n, delta = part_mean - mean;
    mean += delta * n / total;
    m2 += part_m2 + delta * delta * count * n / total;
    count = total;
  }
};

// Channel c's BatchNormStatsExtras (core/kernels/batch_norm.h) from its stored mean and var; count: M.
// Host-and-device: sqrt and fma are the C++ library's on the host and CUDA's intrinsics on the device, both
// correctly rounded.
template <typename T>
DPE_HOST_DEVICE void write_stats_extras(const BatchNormStatsExtras& e, int64_t c, int64_t count, T mean, T var) {
  using std::fma;
  using std::sqrt;
  if (e.invstd != nullptr) static_cast<T*>(e.invstd)[c] = T(1) / sqrt(var + static_cast<T>(e.eps));
  if (e.running_mean != nullptr) {
    const T keep = static_cast<T>(1.0 - e.momentum);
    const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
    T& rm = static_cast<T*>(e.running_mean)[c];
    T& rv = static_cast<T*>(e.running_var)[c];
    rm = fma(static_cast<T>(e.momentum), mean, keep * rm);
    rv = fma(static_cast<T>(e.momentum * unbias), var, keep * rv);
  }
  if (c == 0 && e.num_batches_tracked != nullptr) *e.num_batches_tracked += 1;
}

}  // namespace dpe::kernels::detail
