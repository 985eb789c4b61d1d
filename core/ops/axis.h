// A contiguous tensor seen around one dimension d as (outer, size, inner): the layout the reduction and
// softmax kernels take (core/kernels/reduce.h, softmax.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dpe::detail {

struct Axis {
  int64_t outer = 1, size = 1, inner = 1;
};

// outer = prod(shape[:d]), size = shape[d], inner = prod(shape[d+1:]).
inline Axis axis_of(const Shape& shape, int64_t d) {
  Axis a;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (i < d) a.outer *= shape[i];
    if (i == d) a.size = shape[i];
    if (i > d) a.inner *= shape[i];
  }
  return a;
}

}  // namespace dpe::detail
