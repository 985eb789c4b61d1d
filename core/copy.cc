#include "core/copy.h"

#include "core/autograd/grad_mode.h"
#include "core/dispatch.h"
#include "core/error.h"
#include "core/kernels/copy.h"
#include "core/kernels/elementwise.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_copy.h"
#include "core/pinned_memory.h"
#endif

namespace dpe {

kernels::Layout layout_of(const Tensor& t) {
  DPE_INTERNAL_ASSERT(t.dim() <= kernels::kMaxDims);
  kernels::Layout l;
  l.ndim = static_cast<int>(t.dim());
  for (int d = 0; d < l.ndim; ++d) {
    l.sizes[d] = t.shape()[d];
    l.strides[d] = t.strides()[d];
  }
  return l;
}

namespace {

// Copy between two tensors on the same device, or between any two CPU devices.
void copy_same_backend(const Tensor& dst, const Tensor& src) {
  dispatch(
      dst.device(),
      [&] {
        kernels::copy_cpu(src.data_ptr(), src.dtype(), layout_of(src), dst.data_ptr(), dst.dtype(), layout_of(dst));
      },
      [&](auto stream) {
        kernels::copy_cuda(stream, src.data_ptr(), src.dtype(), layout_of(src), dst.data_ptr(), dst.dtype(),
                           layout_of(dst));
      });
}

bool storages_overlap(const Tensor& a, const Tensor& b) {
  return a.numel() > 0 && b.numel() > 0 && a.storage() == b.storage();
}

#if DPE_WITH_CUDA
// Raw byte transfer of a contiguous tensor to a contiguous tensor of the same dtype on another device.
void transfer_bytes(const Tensor& dst, const Tensor& src, bool non_blocking) {
  DPE_INTERNAL_ASSERT(dst.is_contiguous() && src.is_contiguous() && dst.dtype() == src.dtype());
  size_t nbytes = src.nbytes();
  if (nbytes == 0) return;
  const Device &from = src.device(), &to = dst.device();
  if (from.is_cpu()) {
    // From pinned memory, non_blocking only enqueues the copy; the pinned allocator then keeps the block from
    // reuse until the device's stream has passed the copy.
    const bool enqueue_only = non_blocking && src.is_pinned();
    cuda::copy_host_to_device(to.index, dst.data_ptr(), src.data_ptr(), nbytes, /*synchronize=*/!enqueue_only);
    if (enqueue_only) {
      bool recorded = pinned_host_allocator().record_use(src.storage()->data(), to.index);
      DPE_INTERNAL_ASSERT(recorded, "a pinned tensor's storage is not a live pinned block");
    }
  } else if (to.is_cpu()) {
    cuda::copy_device_to_host(dst.data_ptr(), from.index, src.data_ptr(), nbytes);
  } else {
    cuda::copy_device_to_device(to.index, dst.data_ptr(), from.index, src.data_ptr(), nbytes);
  }
}
#endif

}  // namespace

void copy_into(const Tensor& dst, const Tensor& src, bool non_blocking) {
  DPE_CHECK(dst.shape() == src.shape(), "copy: source shape ", shape_str(src.shape()),
            " does not match destination shape ", shape_str(dst.shape()));
  if (dst.numel() == 0) return;
  NoGradGuard no_grad;  // internal temporaries below must not record
  if (storages_overlap(dst, src)) {
    copy_into(dst, src.detach().clone());
    return;
  }
  if (dst.device() == src.device() || (dst.device().is_cpu() && src.device().is_cpu())) {
    copy_same_backend(dst, src);
    return;
  }
#if DPE_WITH_CUDA
  // Across backends: make the source contiguous where it lives, move its bytes, convert where it lands.
  Tensor packed = src.contiguous();
  if (dst.is_contiguous() && dst.dtype() == src.dtype()) {
    transfer_bytes(dst, packed, non_blocking);
    return;
  }
  Tensor landed = Tensor::empty(src.shape(), TensorOptions(src.dtype()).with_device(dst.device()));
  transfer_bytes(landed, packed, non_blocking);
  copy_same_backend(dst, landed);
#else
  DPE_CHECK(false, "copy from ", src.device(), " to ", dst.device(), ": this dpe build has no CUDA support");
#endif
}

void fill_into(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  if (!dst.is_contiguous()) {
    Tensor filled = Tensor::empty(dst.shape(), TensorOptions(dst.dtype()).with_device(dst.device()));
    fill_into(filled, value);
    copy_into(dst, filled);
    return;
  }
  dispatch(
      dst.device(), [&] { kernels::fill_cpu(dst.data_ptr(), dst.dtype(), dst.numel(), value); },
      [&](auto stream) { kernels::fill_cuda(stream, dst.data_ptr(), dst.dtype(), dst.numel(), value); });
}

void axpy_into(const Tensor& dst, const Tensor& src, double alpha) {
  DPE_CHECK(dst.shape() == src.shape(), "add_: shape ", shape_str(src.shape()), " does not match ",
            shape_str(dst.shape()));
  // Logical CPU devices share host memory, so accumulating a cpu:1 tensor into a cpu:0 one needs no copy
  // (reductions across CPU devices rely on it); any other device pair must be moved first.
  DPE_CHECK(dst.device() == src.device() || (dst.device().is_cpu() && src.device().is_cpu()), "add_: tensors on ",
            dst.device(), " and ", src.device(), "; move one with to()");
  DPE_CHECK(dst.dtype() == src.dtype() && is_compute_type(dst.dtype()), "add_: expected matching float32/float64 "
            "tensors, got ", dst.dtype(), " and ", src.dtype());
  if (dst.numel() == 0) return;
  if (!dst.is_contiguous()) {
    Tensor sum = dst.contiguous();
    axpy_into(sum, src, alpha);
    copy_into(dst, sum);
    return;
  }
  Tensor x = src.contiguous();
  dispatch(
      dst.device(), [&] { kernels::axpy_cpu(dst.dtype(), dst.numel(), alpha, x.data_ptr(), dst.data_ptr()); },
      [&](auto stream) {
        kernels::axpy_cuda(stream, dst.dtype(), dst.numel(), alpha, x.data_ptr(), dst.data_ptr());
      });
}

void scale_into(const Tensor& dst, double value) {
  DPE_CHECK(is_compute_type(dst.dtype()), "mul_: expected a float32/float64 tensor, got ", dst.dtype());
  if (dst.numel() == 0) return;
  if (!dst.is_contiguous()) {
    Tensor scaled = dst.contiguous();
    scale_into(scaled, value);
    copy_into(dst, scaled);
    return;
  }
  dispatch(
      dst.device(),
      [&] { kernels::affine_cpu(dst.dtype(), dst.numel(), dst.data_ptr(), value, 0.0, dst.data_ptr()); },
      [&](auto stream) {
        kernels::affine_cuda(stream, dst.dtype(), dst.numel(), dst.data_ptr(), value, 0.0, dst.data_ptr());
      });
}

void scaled_copy_into(const Tensor& dst, const Tensor& src, double value) {
  const bool one_pass = dst.device() == src.device() && dst.dtype() == src.dtype() && is_compute_type(dst.dtype()) &&
                        dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape();
  if (!one_pass) {
    copy_into(dst, src);
    scale_into(dst, value);
    return;
  }
  if (dst.numel() == 0) return;
  dispatch(
      dst.device(),
      [&] { kernels::affine_cpu(dst.dtype(), dst.numel(), src.data_ptr(), value, 0.0, dst.data_ptr()); },
      [&](auto stream) {
        kernels::affine_cuda(stream, dst.dtype(), dst.numel(), src.data_ptr(), value, 0.0, dst.data_ptr());
      });
}

}  // namespace dpe
