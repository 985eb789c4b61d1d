// Input checks shared by the ops in core/ops/. Each throws naming the op and the offending values.
#pragma once

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace dpe::detail {

inline void check_defined(const Tensor& t, const char* op) { DPE_CHECK(t.defined(), op, ": undefined tensor"); }

inline void check_compute_dtype(const Tensor& t, const char* op) {
  check_defined(t, op);
  DPE_CHECK(is_compute_type(t.dtype()), op, ": expected a float32 or float64 tensor, got ", t.dtype(),
            " (cast storage types with to(DType::Float32))");
}

inline void check_same_device_and_dtype(const Tensor& a, const Tensor& b, const char* op) {
  check_defined(a, op);
  check_defined(b, op);
  DPE_CHECK(a.device() == b.device(), op, ": tensors are on different devices (", a.device(), " and ", b.device(),
            "); move one with to()");
  DPE_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ (", a.dtype(), " and ", b.dtype(), ")");
}

inline TensorOptions options_of(const Tensor& t) { return TensorOptions(t.dtype()).with_device(t.device()); }

// t itself where its last dim has unit stride (what the row kernels read), else a contiguous copy.
inline Tensor with_unit_last_stride(const Tensor& t) { return t.strides().back() == 1 ? t : t.contiguous(); }

// Note [Memory formats] (core/tensor.h): an op whose kernels ran on NCHW copies hands a channels-last input's
// result back in channels-last memory (a copy, differentiable), as PyTorch's ops keep their input's format,
// so that the layers after it see the format the caller chose.
inline Tensor in_format_of(const Tensor& y, const Tensor& input) {
  const bool channels_last =
      input.dim() == 4 && y.dim() == 4 && input.suggest_memory_format() == MemoryFormat::ChannelsLast;
  return channels_last ? y.contiguous(MemoryFormat::ChannelsLast) : y;
}

// A fresh tensor of `shape` with `strides` when they lay its elements out as a permutation of one contiguous
// block (a permuted view, such as attention's heads), else a contiguous one. Backward passes write an input's
// gradient through it, so that the gradient needs no copy on its way back through the permute and the view
// before it.
inline Tensor empty_strided_if_dense(const Shape& shape, const Shape& strides, TensorOptions options) {
  std::vector<size_t> order(shape.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return strides[a] > strides[b]; });
  Shape sizes;
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    sizes.push_back(shape[order[i]]);
    inverse[order[i]] = static_cast<int64_t>(i);
  }
  Tensor t = Tensor::empty(sizes, options).permute(inverse);
  return t.strides() == strides ? t : Tensor::empty(shape, options);
}

// A kernel's pointer for an optional tensor: its data, or null when it is undefined.
inline void* data_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

}  // namespace dpe::detail
