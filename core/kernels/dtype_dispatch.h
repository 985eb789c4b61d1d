// Runtime DType -> compile-time C++ type, for the host code of the kernels (the CPU kernels and the launchers
// in copy_cuda.cu; no TBB, no device code). Private to core/kernels.
//
// The callee gets a TypeTag<T> rather than a T value, so that T need not be default-constructible and no
// value is made up: use `using T = typename decltype(tag)::type;`.
#pragma once

#include "core/dtype.h"
#include "core/error.h"

namespace dpe::kernels::detail {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the C++ storage type of `t` (Half / BFloat16 for the 16-bit floats). Every
// DType has one, so an unknown value is dpe's bug.
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

// Calls f(TypeTag<T>{}) with T = float or double. Any other dtype is the caller's error:
// throws dpe::Error "<what>: dtype <dtype> is not float32 or float64".
template <typename F>
void dispatch_float(DType dtype, const char* what, const F& f) {
  switch (dtype) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    default: DPE_CHECK(false, what, ": dtype ", dtype, " is not float32 or float64");
  }
}

}  // namespace dpe::kernels::detail
