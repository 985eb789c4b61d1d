// Strided copy with dtype conversion, and fill. Used by contiguous(), to(dtype), cat, expand, clone.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernels/backend_types.h"
#include "core/kernels/layout.h"

namespace dpe::kernels {

// dst[idx] = cast<dst_dtype>(src[idx]) for every index of the common sizes.
// Contract: src.sizes == dst.sizes (same ndim); src and dst do not overlap; every dtype pair is allowed
// (float -> int truncates toward zero, like static_cast, but out-of-range values saturate and NaN becomes 0,
// where static_cast is undefined; float16/bfloat16 round to nearest even, once, from the source value).
void copy_cpu(const void* src, DType src_dtype, const Layout& src_layout, void* dst, DType dst_dtype,
              const Layout& dst_layout);
// Both pointers on the stream's device.
void copy_cuda(cudaStream_t stream, const void* src, DType src_dtype, const Layout& src_layout, void* dst,
               DType dst_dtype, const Layout& dst_layout);

// dst[0..n) = value (cast to dtype). dst is contiguous.
void fill_cpu(void* dst, DType dtype, int64_t n, double value);
void fill_cuda(cudaStream_t stream, void* dst, DType dtype, int64_t n, double value);

}  // namespace dpe::kernels
