#include "core/dtype.h"

#include <ostream>

#include "core/error.h"

namespace dpe {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int64: return "int64";
    case DType::Int32: return "int32";
    case DType::UInt8: return "uint8";
  }
  DPE_INTERNAL_ASSERT(false, "unknown dtype ", static_cast<int>(t));
}

DType parse_dtype(std::string_view name) {
  for (DType t : kAllDTypes) {
    if (dtype_name(t) == name) return t;
  }
  DPE_CHECK(false, "unknown dtype '", name,
            "': expected one of float32, float64, float16, bfloat16, int64, int32, uint8");
}

std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

}  // namespace dpe
