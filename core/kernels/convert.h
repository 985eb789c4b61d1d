// One element's dtype conversion, for copy_cpu.cc and copy_cuda.cu (host and device code): both backends
// convert with literally these functions, so CPU and CUDA copies agree bit for bit (the parity test checks).
// Private to core/kernels.
//
// Note [dtype conversion]
// Every source value is first widened to a C++ arithmetic type that holds it exactly (float16/bfloat16 ->
// float; everything else stays), then narrowed once to the destination:
//  - float -> float: static_cast (round to nearest even), except into float16/bfloat16, which round to
//    nearest even once, from the exact source value (no double rounding through float32);
//  - float -> integer: truncation toward zero; out-of-range values saturate and NaN becomes 0 (static_cast
//    is undefined there; saturation is also what CUDA's cvt.rzi.sat instructions do);
//  - integer -> integer: static_cast (two's-complement wrap);
//  - integer -> float: static_cast (round to nearest even).
// Narrowing a double (or an integer, through double) to float16/bfloat16 goes through float32 *rounded to
// odd*: the float keeps the sticky information that round-to-nearest would lose, so the final float ->
// half/bfloat16 rounding is the correctly rounded one (float has >= 13 more mantissa bits than either, enough
// for round-to-odd to be exact). int64 values beyond 2^53 round once on the way to double; only those can be
// double-rounded.
//
// Device code: std::numeric_limits is constexpr host code, usable on the device because the build passes
// nvcc --expt-relaxed-constexpr (tools/build/defs.bzl).
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "core/dtype.h"
#include "core/host_device.h"

namespace dpe::kernels::detail {

// The source value as an arithmetic type that holds it exactly.
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

// double -> float, rounding toward zero and setting the last mantissa bit when inexact (round to odd).
DPE_HOST_DEVICE float double_to_float_round_odd(double d) {
#if defined(__CUDA_ARCH__)
  float f = __double2float_rz(d);
#else
  float f = static_cast<float>(d);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
#endif
  if (d != d || static_cast<double>(f) == d) return f;  // NaN, or exact
  return bits_float(float_bits(f) | 1u);
}

// A float value for the final float -> float16/bfloat16 rounding.
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
  // min - 1, or min itself where F rounds it so; anything above truncates to a value >= min.
  constexpr F kLowerExclusive = F(std::numeric_limits<I>::min()) - F(1);
  if (f != f) return I(0);
  if (f >= kUpper) return std::numeric_limits<I>::max();
  if (f <= kLowerExclusive) return std::numeric_limits<I>::min();
  return static_cast<I>(f);
}

// A widened value W to the destination type D, rounding once.
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

// S -> D by Note [dtype conversion]. For S == D this is the identity on every value except NaNs of the 16-bit
// floats, which the round trip through float changes: a float16 NaN becomes the quiet NaN 0x7e00 (sign kept),
// a signalling bfloat16 NaN gets its quiet bit set. Callers that must keep such bits copy them instead.
template <typename D, typename S>
DPE_HOST_DEVICE D convert(S s) {
  return narrow<D>(widen(s));
}

}  // namespace dpe::kernels::detail
