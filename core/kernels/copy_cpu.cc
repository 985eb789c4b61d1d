// CPU strided copy with dtype conversion, and fill.
//
// Conversion rules (every pair of dtypes, see Note [CPU dtype conversion]):
//  - float -> float: static_cast (round to nearest even), except into float16/bfloat16, which round to
//    nearest even once, from the exact source value (no double rounding through float32);
//  - float -> integer: truncation toward zero; out-of-range values saturate and NaN becomes 0 (static_cast
//    is undefined there; saturation is also what CUDA's cvt.rzi.sat instructions do);
//  - integer -> integer: static_cast (two's-complement wrap);
//  - integer -> float: static_cast (round to nearest even).
//
// Thread-safety: copy_cpu and fill_cpu only write dst; concurrent calls on disjoint dst are safe. Large
// copies run under tbb::parallel_for in the caller's task_arena; the result never depends on the split.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "core/kernels/copy.h"

namespace dpe::kernels {
namespace {

// Below this many elements a copy runs on the calling thread; above, in chunks of about this size.
constexpr int64_t kParallelGrain = 32768;

template <typename F>
void parallel_range(int64_t n, const F& body) {
  if (n <= kParallelGrain) {
    body(int64_t{0}, n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kParallelGrain),
                    [&](const tbb::blocked_range<int64_t>& r) { body(r.begin(), r.end()); });
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the C++ storage type of `t`.
template <typename F>
void dispatch_dtype(DType t, const F& f) {
  switch (t) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    case DType::Float16: return f(TypeTag<Half>{});
    case DType::BFloat16: return f(TypeTag<BFloat16>{});
    case DType::Int64: return f(TypeTag<int64_t>{});
    case DType::Int32: return f(TypeTag<int32_t>{});
    case DType::UInt8: return f(TypeTag<uint8_t>{});
  }
  DPE_INTERNAL_ASSERT(false, "unknown dtype ", static_cast<int>(t));
}

// Note [CPU dtype conversion]
// Every source value is first widened to a C++ arithmetic type that holds it exactly (float16/bfloat16 ->
// float; everything else stays), then narrowed once to the destination. Narrowing a double (or an integer,
// through double) to float16/bfloat16 goes through float32 *rounded to odd*: the float keeps the sticky
// information that round-to-nearest would lose, so the final float -> half/bfloat16 rounding is the correctly
// rounded one (float has >= 13 more mantissa bits than either, enough for round-to-odd to be exact).
// int64 values beyond 2^53 round once on the way to double; only those can be double-rounded.

template <typename S>
auto widen(S s) {
  if constexpr (std::is_same_v<S, Half>) {
    return half_to_float(s);
  } else if constexpr (std::is_same_v<S, BFloat16>) {
    return bfloat16_to_float(s);
  } else {
    return s;
  }
}

// double -> float, rounding toward zero and setting the last mantissa bit when inexact.
inline float double_to_float_round_odd(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  return bits_float(float_bits(f) | 1u);
}

// A float value for the final float -> float16/bfloat16 rounding.
template <typename W>
float to_float_for_narrow(W w) {
  if constexpr (std::is_same_v<W, float>) {
    return w;
  } else {
    return double_to_float_round_odd(static_cast<double>(w));
  }
}

// Truncation toward zero with saturation; NaN -> 0.
template <typename I, typename F>
I float_to_int(F f) {
  constexpr F kUpper = F(std::numeric_limits<I>::max() / 2 + 1) * F(2);  // 2^bits or 2^(bits-1), exact
  // min - 1, or min itself where F rounds it so; anything above truncates to a value >= min.
  constexpr F kLowerExclusive = F(std::numeric_limits<I>::min()) - F(1);
  if (f != f) return I(0);
  if (f >= kUpper) return std::numeric_limits<I>::max();
  if (f <= kLowerExclusive) return std::numeric_limits<I>::min();
  return static_cast<I>(f);
}

template <typename D, typename W>
D narrow(W w) {
  if constexpr (std::is_same_v<D, Half>) {
    return float_to_half(to_float_for_narrow(w));
  } else if constexpr (std::is_same_v<D, BFloat16>) {
    return float_to_bfloat16(to_float_for_narrow(w));
  } else if constexpr (std::is_integral_v<D> && std::is_floating_point_v<W>) {
    return float_to_int<D>(w);
  } else {
    return static_cast<D>(w);
  }
}

template <typename D, typename S>
D convert(S s) {
  return narrow<D>(widen(s));
}

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

void check_layout(const Layout& l, const char* what) {
  DPE_CHECK(l.ndim >= 0 && l.ndim <= kMaxDims, what, ": ndim ", l.ndim, " outside [0, ", kMaxDims, "]");
  for (int d = 0; d < l.ndim; ++d) {
    DPE_CHECK(l.sizes[d] >= 0 && l.strides[d] >= 0, what, ": dimension ", d, " has size ", l.sizes[d],
              " and stride ", l.strides[d], "; both must be >= 0");
  }
}

}  // namespace

// src: src_layout  dst: dst_layout, same sizes; n = numel elements converted src_dtype -> dst_dtype.
void copy_cpu(const void* src, DType src_dtype, const Layout& src_layout, void* dst, DType dst_dtype,
              const Layout& dst_layout) {
  check_layout(src_layout, "copy_cpu src");
  check_layout(dst_layout, "copy_cpu dst");
  DPE_CHECK(src_layout.ndim == dst_layout.ndim, "copy_cpu: src has ", src_layout.ndim, " dims, dst has ",
            dst_layout.ndim);
  for (int d = 0; d < src_layout.ndim; ++d) {
    DPE_CHECK(src_layout.sizes[d] == dst_layout.sizes[d], "copy_cpu: dimension ", d, " has size ",
              src_layout.sizes[d], " in src and ", dst_layout.sizes[d], " in dst");
  }
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
  DPE_CHECK(n >= 0, "fill_cpu: n = ", n, " is negative");
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
