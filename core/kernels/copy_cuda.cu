// CUDA strided copy with dtype conversion, and fill (core/kernels/copy.h).
//
// Conversions are bit-identical to copy_cpu.cc (Note [CPU dtype conversion] there): widen exactly
// (float16/bfloat16 -> float), narrow once; double and integers reach float16/bfloat16 through float32
// rounded to odd, so the final rounding is the correct one; float -> integer truncates toward zero with
// saturation and NaN -> 0. The parity test compares these kernels with copy_cpu exactly.
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/kernels/copy.h"
#include "core/kernels/cuda_launch.cuh"

namespace dpe::kernels {
namespace {

using cuda_detail::first_index;
using cuda_detail::grid_for;
using cuda_detail::grid_stride;
using cuda_detail::kBlock;

// Calls f(T{}) with the C++ storage type of `t` (Half/BFloat16 for the 16-bit floats).
template <typename F>
void dispatch_storage_type(DType t, F&& f) {
  switch (t) {
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::Float16: return f(Half{});
    case DType::BFloat16: return f(BFloat16{});
    case DType::Int64: return f(int64_t{});
    case DType::Int32: return f(int32_t{});
    case DType::UInt8: return f(uint8_t{});
  }
  DPE_INTERNAL_ASSERT(false, "unknown dtype ", static_cast<int>(t));
}

template <typename S>
DPE_HOST_DEVICE auto widen(S s) {
  if constexpr (std::is_same_v<S, Half>) {
    return half_to_float(s);
  } else if constexpr (std::is_same_v<S, BFloat16>) {
    return bfloat16_to_float(s);
  } else {
    return s;
  }
}

// double -> float rounding toward zero, with the last mantissa bit set when inexact (round to odd).
DPE_HOST_DEVICE float double_to_float_round_odd(double d) {
#if defined(__CUDA_ARCH__)
  float f = __double2float_rz(d);
#else
  float f = static_cast<float>(d);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
#endif
  if (d != d || static_cast<double>(f) == d) return f;
  return bits_float(float_bits(f) | 1u);
}

template <typename W>
DPE_HOST_DEVICE float to_float_for_narrow(W w) {
  if constexpr (std::is_same_v<W, float>) {
    return w;
  } else {
    return double_to_float_round_odd(static_cast<double>(w));
  }
}

// Truncation toward zero with saturation; NaN -> 0.
template <typename I, typename F>
DPE_HOST_DEVICE I float_to_int(F f) {
  constexpr F kUpper = F(std::numeric_limits<I>::max() / 2 + 1) * F(2);  // 2^bits or 2^(bits-1), exact
  constexpr F kLowerExclusive = F(std::numeric_limits<I>::min()) - F(1);
  if (f != f) return I(0);
  if (f >= kUpper) return std::numeric_limits<I>::max();
  if (f <= kLowerExclusive) return std::numeric_limits<I>::min();
  return static_cast<I>(f);
}

template <typename D, typename W>
DPE_HOST_DEVICE D narrow(W w) {
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
DPE_HOST_DEVICE D convert(S s) {
  if constexpr (std::is_same_v<S, D>) {
    return s;  // bit copy (keeps NaN payloads, like copy_cpu's memcpy)
  } else {
    return narrow<D>(widen(s));
  }
}

// src: src_layout  dst: dst_layout, same sizes, n = numel. A contiguous operand skips the index arithmetic.
template <typename S, typename D>
__global__ void copy_kernel(int64_t n, const S* src, Layout src_layout, bool src_contiguous, D* dst,
                            Layout dst_layout, bool dst_contiguous) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t s = src_contiguous ? i : src_layout.offset_of(i);
    const int64_t d = dst_contiguous ? i : dst_layout.offset_of(i);
    dst[d] = convert<D>(src[s]);
  }
}

// dst: (n)
template <typename D>
__global__ void fill_kernel(int64_t n, D* dst, D value) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = value;
}

void check_layout(const Layout& l, const char* what) {
  DPE_CHECK(l.ndim >= 0 && l.ndim <= kMaxDims, what, ": ndim ", l.ndim, " outside [0, ", kMaxDims, "]");
  for (int d = 0; d < l.ndim; ++d) {
    DPE_CHECK(l.sizes[d] >= 0 && l.strides[d] >= 0, what, ": dimension ", d, " has size ", l.sizes[d],
              " and stride ", l.strides[d], "; both must be >= 0");
  }
}

}  // namespace

// src: src_layout  dst: dst_layout, same sizes; both on the stream's device.
void copy_cuda(cudaStream_t stream, const void* src, DType src_dtype, const Layout& src_layout, void* dst,
               DType dst_dtype, const Layout& dst_layout) {
  check_layout(src_layout, "copy_cuda src");
  check_layout(dst_layout, "copy_cuda dst");
  DPE_CHECK(src_layout.ndim == dst_layout.ndim, "copy_cuda: src has ", src_layout.ndim, " dims, dst has ",
            dst_layout.ndim);
  for (int d = 0; d < src_layout.ndim; ++d) {
    DPE_CHECK(src_layout.sizes[d] == dst_layout.sizes[d], "copy_cuda: dimension ", d, " has size ",
              src_layout.sizes[d], " in src and ", dst_layout.sizes[d], " in dst");
  }
  const int64_t n = src_layout.numel();
  if (n == 0) return;
  const bool src_contiguous = src_layout.is_contiguous(), dst_contiguous = dst_layout.is_contiguous();
  dispatch_storage_type(src_dtype, [&](auto src_tag) {
    using S = decltype(src_tag);
    dispatch_storage_type(dst_dtype, [&](auto dst_tag) {
      using D = decltype(dst_tag);
      copy_kernel<S, D><<<grid_for(n), kBlock, 0, stream>>>(n, static_cast<const S*>(src), src_layout,
                                                           src_contiguous, static_cast<D*>(dst), dst_layout,
                                                           dst_contiguous);
      DPE_CUDA_CHECK_LAUNCH();
    });
  });
}

// dst: (n) on the stream's device.
void fill_cuda(cudaStream_t stream, void* dst, DType dtype, int64_t n, double value) {
  DPE_CHECK(n >= 0, "fill_cuda: n = ", n, " is negative");
  if (n == 0) return;
  dispatch_storage_type(dtype, [&](auto tag) {
    using D = decltype(tag);
    fill_kernel<D><<<grid_for(n), kBlock, 0, stream>>>(n, static_cast<D*>(dst), convert<D>(value));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpe::kernels
