// Layout: sizes and element strides of an N-d operand, passed by value to CPU and CUDA kernels.
// Kernels never see Tensor: the tensor layer (core/ops) validates, broadcasts and allocates, then hands
// kernels raw pointers plus Layouts. A stride of 0 broadcasts that dimension.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace dpe::kernels {

inline constexpr int kMaxDims = 8;

struct Layout {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements, may be 0 (broadcast) but never negative

  DPE_HOST_DEVICE int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= sizes[d];
    return n;
  }

  DPE_HOST_DEVICE bool is_contiguous() const {
    int64_t expected = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (sizes[d] != 1 && strides[d] != expected) return false;
      expected *= sizes[d];
    }
    return true;
  }

  // Element offset of the linear (row-major) index `linear` in this layout.
  DPE_HOST_DEVICE int64_t offset_of(int64_t linear) const {
    int64_t offset = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      int64_t i = linear % sizes[d];
      linear /= sizes[d];
      offset += i * strides[d];
    }
    return offset;
  }
};

// A contiguous layout of the given sizes.
inline Layout contiguous_layout(int ndim, const int64_t* sizes) {
  Layout l;
  l.ndim = ndim;
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    l.sizes[d] = sizes[d];
    l.strides[d] = stride;
    stride *= sizes[d];
  }
  return l;
}

}  // namespace dpe::kernels
