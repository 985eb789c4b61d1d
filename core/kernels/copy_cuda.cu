// CUDA strided copy with dtype conversion, and fill (core/kernels/copy.h).
//
// Conversions are core/kernels/convert.h (Note [dtype conversion]), the functions copy_cpu.cc uses, so the
// results are bit-identical to copy_cpu; the parity test compares these kernels with copy_cpu exactly.
#include <cstdint>
#include <type_traits>

#include "core/kernels/arg_checks.h"
#include "core/kernels/convert.h"
#include "core/kernels/copy.h"
#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/dtype_dispatch.h"
#include "core/kernels/offset_calc.h"

namespace dpe::kernels {
namespace {

using detail::first_index;
using detail::grid_for;
using detail::grid_stride;
using detail::kBlock;

using detail::dispatch_dtype;
using detail::OffsetCalc32;

// convert<D>, except that a same-type copy is a bit copy: it keeps the 16-bit float NaN bits that convert's
// round trip through float changes. (copy_cpu bit-copies contiguous same-type data too, with memcpy; its
// strided same-type loop goes through convert.)
template <typename D, typename S>
DPE_HOST_DEVICE D copy_value(S s) {
  if constexpr (std::is_same_v<S, D>) {
    return s;
  } else {
    return detail::convert<D>(s);
  }
}

// src: src_layout  dst: dst_layout, same sizes, n = numel. A contiguous operand skips the index arithmetic.
template <typename S, typename D>
__global__ void copy_kernel(int64_t n, const S* src, Layout src_layout, bool src_contiguous, D* dst,
                            Layout dst_layout, bool dst_contiguous) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t s = src_contiguous ? i : src_layout.offset_of(i);
    const int64_t d = dst_contiguous ? i : dst_layout.offset_of(i);
    dst[d] = copy_value<D>(src[s]);
  }
}

// src, dst: offsets from `calc` (the coalesced layouts, core/kernels/offset_calc.h), n < 2^31.
template <typename S, typename D>
__global__ void copy_strided32_kernel(uint32_t n, const S* src, D* dst, OffsetCalc32<2> calc) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    uint32_t off[2];
    calc.offsets(i, off);
    dst[off[1]] = copy_value<D>(src[off[0]]);
  }
}

// dst: (n)
template <typename D>
__global__ void fill_kernel(int64_t n, D* dst, D value) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = value;
}

}  // namespace

// src: src_layout  dst: dst_layout, same sizes; both on the stream's device.
void copy_cuda(cudaStream_t stream, const void* src, DType src_dtype, const Layout& src_layout, void* dst,
               DType dst_dtype, const Layout& dst_layout) {
  detail::check_copy_layouts("copy_cuda", src_layout, dst_layout);
  const int64_t n = src_layout.numel();
  if (n == 0) return;
  const bool src_contiguous = src_layout.is_contiguous(), dst_contiguous = dst_layout.is_contiguous();
  OffsetCalc32<2> calc;
  const Layout* const operands[2] = {&src_layout, &dst_layout};
  const bool strided32 = !(src_contiguous && dst_contiguous) && detail::make_offset_calc32(operands, &calc);
  dispatch_dtype(src_dtype, [&](auto src_tag) {
    using S = typename decltype(src_tag)::type;
    dispatch_dtype(dst_dtype, [&](auto dst_tag) {
      using D = typename decltype(dst_tag)::type;
      if (strided32) {
        copy_strided32_kernel<S, D><<<grid_for(n), kBlock, 0, stream>>>(
            static_cast<uint32_t>(n), static_cast<const S*>(src), static_cast<D*>(dst), calc);
        DPE_CUDA_CHECK_LAUNCH();
        return;
      }
      copy_kernel<S, D><<<grid_for(n), kBlock, 0, stream>>>(n, static_cast<const S*>(src), src_layout,
                                                           src_contiguous, static_cast<D*>(dst), dst_layout,
                                                           dst_contiguous);
      DPE_CUDA_CHECK_LAUNCH();
    });
  });
}

// dst: (n) on the stream's device.
void fill_cuda(cudaStream_t stream, void* dst, DType dtype, int64_t n, double value) {
  detail::check_n("fill_cuda", n);
  if (n == 0) return;
  dispatch_dtype(dtype, [&](auto tag) {
    using D = typename decltype(tag)::type;
    fill_kernel<D><<<grid_for(n), kBlock, 0, stream>>>(n, static_cast<D*>(dst), detail::convert<D>(value));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpe::kernels
