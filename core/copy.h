// Data movement and in-place updates behind Tensor::copy_, to(), clone(), fill_, add_, mul_.
// Not differentiable, not part of the user API (use the Tensor methods).
//
// copy_into handles every pair of devices: CPU<->CPU (host memory is shared by all CPU devices),
// host<->GPU, GPU<->GPU (peer or staged, see core/cuda/cuda_copy.h), converting dtype and strides on the
// way. Ordering: the copy runs after work already enqueued on the devices involved and before work
// enqueued on them afterwards.
#pragma once

#include "core/kernels/layout.h"
#include "core/tensor.h"

namespace dpe {

// dst[...] = src[...]; same shape (src may be an expanded view), any devices and dtypes. Overlapping
// storage is handled (src is copied out first). non_blocking: see Tensor::to(device, non_blocking).
void copy_into(const Tensor& dst, const Tensor& src, bool non_blocking = false);
void fill_into(const Tensor& dst, double value);
// dst += alpha * src (same shape and floating dtype; same device, or any two CPU devices).
void axpy_into(const Tensor& dst, const Tensor& src, double alpha);
// dst *= value
void scale_into(const Tensor& dst, double value);
// dst = value * src (same shape): one pass when both are contiguous with the same float dtype on one device,
// else a copy and a scale.
void scaled_copy_into(const Tensor& dst, const Tensor& src, double value);

kernels::Layout layout_of(const Tensor& t);

}  // namespace dpe
