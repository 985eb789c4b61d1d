// Element offsets of strided operands from a linear index in 32-bit arithmetic, for the CUDA kernels that
// take Layouts (copy_cuda, binary_cuda). Private to core/kernels; host-and-device, so the CPU tests check the
// same code the GPU runs.
//
// Why: Layout::offset_of divides the index by every dimension's size in int64, which a GPU emulates in tens
// of instructions per division. A permuted (B, H, T, hd) activation or a broadcast (T, hd) table made every
// element of tiny-llama's attention pay 8 of them. Here the layouts are first coalesced (cpu_strided.h:
// size-1 dimensions dropped, dimensions contiguous in every operand merged: a broadcast table over (B, H)
// becomes 2 dimensions), and each division by a size is a multiply-high and a shift (FastDivmod).
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/kernels/cpu_strided.h"
#include "core/kernels/layout.h"

namespace dpe::kernels::detail {

// n / d and n % d for a fixed divisor 1 <= d < 2^31 and any n < 2^31, without a division: with
// s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1 (< 2^32), n / d = (mulhi(m, n) + n) >> s, where the
// sum stays below 2^32 because mulhi(m, n) < n < 2^31 (Granlund and Montgomery 1994, the round-up method).
struct FastDivmod {
  uint32_t divisor = 1, magic = 1, shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(uint32_t d) : divisor(d) {
    while ((uint64_t{1} << shift) < d) ++shift;
    magic = static_cast<uint32_t>((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d) / d + 1);
  }

  DPE_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(magic, n);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{magic} * n) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

// n / d for 0 <= n < limit and a divisor d >= 1 fixed when the kernel is launched: FastDivmod's multiply-high
// when 31 bits hold both (every dpe activation but the largest), int64 division otherwise. The choice is made
// once on the host, so a warp's threads never diverge on it. For the kernels that split flat indices into
// (plane, row, column) or (n, channel, spatial) coordinates: pooling, batch normalisation.
struct Divider {
  FastDivmod fast;
  int64_t divisor = 1;
  bool narrow = true;

  Divider() = default;
  Divider(int64_t d, int64_t limit)
      : divisor(d), narrow(limit <= (int64_t{1} << 31) && d < (int64_t{1} << 31)) {
    if (narrow) fast = FastDivmod(static_cast<uint32_t>(d));
  }

  DPE_HOST_DEVICE int64_t div(int64_t n) const { return narrow ? fast.div(static_cast<uint32_t>(n)) : n / divisor; }
};

// Offsets of N operands that share sizes, for linear indices below 2^31. Dimensions innermost first.
template <int N>
struct OffsetCalc32 {
  int ndim = 0;
  FastDivmod sizes[kMaxDims];
  uint32_t strides[kMaxDims][N] = {};

  // offsets[op] = operand op's element offset at the row-major linear index.
  DPE_HOST_DEVICE void offsets(uint32_t linear, uint32_t (&offsets)[N]) const {
    for (int op = 0; op < N; ++op) offsets[op] = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == ndim) break;
      const uint32_t q = sizes[d].div(linear);
      const uint32_t i = linear - q * sizes[d].divisor;
      linear = q;
      for (int op = 0; op < N; ++op) offsets[op] += i * strides[d][op];
    }
  }
};

// The 32-bit calculator of N layouts with the same sizes, or false when 31 bits do not hold every linear
// index and every operand's largest offset (then the caller uses Layout::offset_of).
template <int N>
bool make_offset_calc32(const Layout* const (&layouts)[N], OffsetCalc32<N>* calc) {
  constexpr int64_t kLimit = (int64_t{1} << 31) - 1;
  const Coalesced<N> c = coalesce(layouts);
  int64_t numel = 1;
  int64_t largest[N] = {};
  for (int d = 0; d < c.ndim; ++d) {
    numel *= c.sizes[d];
    for (int op = 0; op < N; ++op) largest[op] += (c.sizes[d] - 1) * c.strides[op][d];
  }
  if (numel > kLimit) return false;
  for (int op = 0; op < N; ++op) {
    if (largest[op] > kLimit) return false;
  }
  calc->ndim = c.ndim;
  for (int d = 0; d < c.ndim; ++d) {
    const int from = c.ndim - 1 - d;  // Coalesced lists the outermost first
    calc->sizes[d] = FastDivmod(static_cast<uint32_t>(c.sizes[from]));
    for (int op = 0; op < N; ++op) calc->strides[d][op] = static_cast<uint32_t>(c.strides[op][from]);
  }
  return true;
}

}  // namespace dpe::kernels::detail
