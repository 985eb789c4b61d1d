// Element types. float32 is the training type, float64 exists for numerical gradient checks,
// float16/bfloat16 are storage types (cast to float32 to compute), integers hold labels and indices.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/host_device.h"

namespace dpe {

enum class DType : uint8_t { Float32, Float64, Float16, BFloat16, Int64, Int32, UInt8 };

inline constexpr DType kAllDTypes[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                                       DType::Int64,   DType::Int32,   DType::UInt8};

constexpr size_t element_size(DType t) {
  switch (t) {
    case DType::Float64:
    case DType::Int64: return 8;
    case DType::Float32:
    case DType::Int32: return 4;
    case DType::Float16:
    case DType::BFloat16: return 2;
    case DType::UInt8: return 1;
  }
  return 0;
}

constexpr bool is_floating_point(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
}

// The types kernels compute in (everything else is storage, cast first).
constexpr bool is_compute_type(DType t) { return t == DType::Float32 || t == DType::Float64; }

std::string_view dtype_name(DType t);  // "float32", "bfloat16", ...
DType parse_dtype(std::string_view name);  // inverse of dtype_name; throws on an unknown name
std::ostream& operator<<(std::ostream& os, DType t);

// IEEE half and bfloat16 as 16-bit storage. Conversions round to nearest even and keep NaN/Inf.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

DPE_HOST_DEVICE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

DPE_HOST_DEVICE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

DPE_HOST_DEVICE BFloat16 float_to_bfloat16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(u >> 16)};
}

DPE_HOST_DEVICE float bfloat16_to_float(BFloat16 h) { return bits_float(static_cast<uint32_t>(h.bits) << 16); }

DPE_HOST_DEVICE Half float_to_half(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return Half{static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow -> Inf
  if (abs < 0x38800000u) {                                                     // subnormal or zero
    // Add 0.5f so the FPU's own round-to-nearest-even places the mantissa bits.
    float shifted = bits_float(abs) + 0.5f;
    return Half{static_cast<uint16_t>(sign | (float_bits(shifted) - 0x3f000000u))};
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return Half{static_cast<uint16_t>(sign | (abs >> 13))};
}

DPE_HOST_DEVICE float half_to_float(Half h) {
  uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
  if (exp == 0) {                                                         // subnormal or zero
    float magnitude = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24
    return bits_float(sign | float_bits(magnitude));
  }
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

}  // namespace dpe
