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
#include "core/kernels/cpu_strided.h"
#include "core/kernels/dtype_dispatch.h"

namespace dpe::kernels {
namespace {

using detail::coalesce;
using detail::for_each_run;
using detail::parallel_range;
using detail::convert;
using detail::dispatch_dtype;

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
      const Layout* layouts[] = {&src_layout, &dst_layout};
      const auto c = coalesce(layouts);
      const int last = c.ndim - 1;
      parallel_range(n, [&](int64_t begin, int64_t end) {
        for_each_run(c, begin, end, [&](const int64_t* off, int64_t len) {
          convert_run(s + off[0], c.strides[0][last], d + off[1], c.strides[1][last], len);
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
