// CPU strided copy with dtype conversion, and fill. Element conversion: core/kernels/convert.h (Note
// [dtype conversion]), shared with copy_cuda.cu; this file only decides how to walk the layouts.
//
// Thread-safety: copy_cpu and fill_cpu only write dst; concurrent calls on disjoint dst are safe. Large
// copies run under tbb::parallel_for in the caller's task_arena; the result never depends on the split.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "core/kernels/arg_checks.h"
#include "core/kernels/convert.h"
#include "core/kernels/copy.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/dtype_dispatch.h"

namespace dpe::kernels {
namespace {

using cpu_detail::parallel_range;
using detail::convert;
using detail::dispatch_dtype;

// A copy's two operands after dropping size-1 dimensions and merging dimensions that are contiguous with
// respect to each other in both, so that the innermost loop is as long as possible.
struct Coalesced {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[2][kMaxDims] = {};
};

Coalesced coalesce(const Layout& src, const Layout& dst) {
  Coalesced c;
  for (int d = 0; d < src.ndim; ++d) {
    if (src.sizes[d] == 1) continue;
    int k = c.ndim;
    if (k > 0 && src.strides[d] * src.sizes[d] == c.strides[0][k - 1] &&
        dst.strides[d] * src.sizes[d] == c.strides[1][k - 1]) {
      c.sizes[k - 1] *= src.sizes[d];
      c.strides[0][k - 1] = src.strides[d];
      c.strides[1][k - 1] = dst.strides[d];
      continue;
    }
    c.sizes[k] = src.sizes[d];
    c.strides[0][k] = src.strides[d];
    c.strides[1][k] = dst.strides[d];
    ++c.ndim;
  }
  if (c.ndim == 0) {  // a single element
    c.ndim = 1;
    c.sizes[0] = 1;
  }
  return c;
}

// Calls run(src_offset, dst_offset, len) for the runs along the innermost dimension that cover the
// row-major linear indices [begin, end).
template <typename F>
void for_each_run(const Coalesced& c, int64_t begin, int64_t end, const F& run) {
  const int last = c.ndim - 1;
  int64_t idx[kMaxDims];
  int64_t off[2] = {0, 0};
  int64_t rest = begin;
  for (int d = last; d >= 0; --d) {
    idx[d] = rest % c.sizes[d];
    rest /= c.sizes[d];
    off[0] += idx[d] * c.strides[0][d];
    off[1] += idx[d] * c.strides[1][d];
  }
  for (int64_t pos = begin; pos < end;) {
    const int64_t len = std::min(c.sizes[last] - idx[last], end - pos);
    run(off[0], off[1], len);
    pos += len;
    idx[last] += len;
    off[0] += len * c.strides[0][last];
    off[1] += len * c.strides[1][last];
    for (int d = last; d > 0 && idx[d] == c.sizes[d]; --d) {  // carry
      idx[d] = 0;
      off[0] += c.strides[0][d - 1] - c.sizes[d] * c.strides[0][d];
      off[1] += c.strides[1][d - 1] - c.sizes[d] * c.strides[1][d];
      ++idx[d - 1];
    }
  }
}

// dst[i * dst_stride] = convert(src[i * src_stride]) for i in [0, len).
template <typename S, typename D>
void convert_run(const S* src, int64_t src_stride, D* dst, int64_t dst_stride, int64_t len) {
  if constexpr (std::is_same_v<S, D>) {
    if (src_stride == 1 && dst_stride == 1) {
      std::memcpy(dst, src, static_cast<size_t>(len) * sizeof(S));
      return;
    }
  }
  if (src_stride == 1 && dst_stride == 1) {
    for (int64_t i = 0; i < len; ++i) dst[i] = convert<D>(src[i]);
  } else {
    for (int64_t i = 0; i < len; ++i) dst[i * dst_stride] = convert<D>(src[i * src_stride]);
  }
}

}  // namespace

// src: src_layout  dst: dst_layout, same sizes; n = numel elements converted src_dtype -> dst_dtype.
void copy_cpu(const void* src, DType src_dtype, const Layout& src_layout, void* dst, DType dst_dtype,
              const Layout& dst_layout) {
  detail::check_copy_layouts("copy_cpu", src_layout, dst_layout);
  const int64_t n = src_layout.numel();
  if (n == 0) return;
  DPE_CHECK(src != nullptr && dst != nullptr, "copy_cpu: null pointer for ", n, " elements");

  dispatch_dtype(src_dtype, [&](auto src_tag) {
    using S = typename decltype(src_tag)::type;
    dispatch_dtype(dst_dtype, [&](auto dst_tag) {
      using D = typename decltype(dst_tag)::type;
      const S* s = static_cast<const S*>(src);
      D* d = static_cast<D*>(dst);
      if (src_layout.is_contiguous() && dst_layout.is_contiguous()) {
        parallel_range(n, [&](int64_t begin, int64_t end) { convert_run(s + begin, 1, d + begin, 1, end - begin); });
        return;
      }
      const Coalesced c = coalesce(src_layout, dst_layout);
      const int last = c.ndim - 1;
      parallel_range(n, [&](int64_t begin, int64_t end) {
        for_each_run(c, begin, end, [&](int64_t src_off, int64_t dst_off, int64_t len) {
          convert_run(s + src_off, c.strides[0][last], d + dst_off, c.strides[1][last], len);
        });
      });
    });
  });
}

// dst: (n) contiguous.
void fill_cpu(void* dst, DType dtype, int64_t n, double value) {
  detail::check_n("fill_cpu", n);
  if (n == 0) return;
  DPE_CHECK(dst != nullptr, "fill_cpu: null pointer for ", n, " elements");
  dispatch_dtype(dtype, [&](auto tag) {
    using D = typename decltype(tag)::type;
    const D v = convert<D>(value);
    D* d = static_cast<D*>(dst);
    parallel_range(n, [&](int64_t begin, int64_t end) { std::fill(d + begin, d + end, v); });
  });
}

}  // namespace dpe::kernels
