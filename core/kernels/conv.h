// 2-d convolution (PyTorch's conv2d: cross-correlation, NCHW, groups), forward and its two backward passes.
//
// Layouts (all contiguous, dtype float32 or float64, or 16-bit operands for autocast's convolutions
// (core/amp/autocast.h): each pass's inputs x, w, dy in bfloat16 (CPU and CUDA) or float16 (CUDA only),
// accumulated in float32, and its output y, dx or dw and the bias in float32 (conv2d_output_dtype)):
//   x:  (N, C_in, H, W)                      y:  (N, C_out, H_out, W_out)
//   w:  (C_out, C_in / groups, kH, kW)       b:  (C_out) or null
//   H_out = (H + 2 pad_h - dil_h (kH - 1) - 1) / stride_h + 1, likewise W_out.
//
// CPU (conv_cpu.cc): float32 on oneDNN's convolution primitives (JIT for the CPU it finds; one primitive
// per shape, cached); float64 (gradient checks) as im2col + gemm_cpu (core/kernels/matmul.h): no
// hand-written GEMM in either path.
// CUDA (conv_cuda.cu): cuDNN (cudnnConvolutionForward / BackwardData / BackwardFilter), no TF32 (FMA math),
// so float32 results compare with the CPU's to a few ulps * K; deterministic algorithms by default, the
// fastest measured ones under backends::cudnn::benchmark (core/backends.h). 16-bit
// operands run on tensor cores, and cuDNN writes 16-bit results (its legacy API has no mixed output type):
// each output is rounded to the operand type once, then widened to float32, as PyTorch's CUDA autocast
// rounds it; the CPU's float32 outputs are not rounded.
//
// Contract: outputs are overwritten (=), never accumulated; conv2d_backward_weight writes dw for the
// whole batch. The bias gradient (the sum of dy over N, H_out, W_out) is not computed here: the op
// layer does it with a reduction.
// Thread-safety: calls on distinct outputs may run concurrently (the primitive and algorithm caches are
// locked).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"
#include "core/kernels/backend_types.h"

namespace dpe::kernels {

struct Conv2dShape {
  DType dtype = DType::Float32;
  int64_t n = 0, c_in = 0, h = 0, w = 0;   // input
  int64_t c_out = 0, kh = 0, kw = 0;       // weight: (c_out, c_in / groups, kh, kw)
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dil_h = 1, dil_w = 1;
  int64_t groups = 1;
  // CPU, bfloat16 operands only: x and dy arrive in float32 and are rounded to bfloat16 (round to nearest even)
  // by the relayout into oneDNN's layout, one pass where a cast and a reorder were two; w is bfloat16 as usual.
  bool f32_activations = false;
  // CPU only (not float64): x, y, dx and dy are channels last, (N, H, W, C) in memory (Note [Memory formats],
  // core/tensor.h); the layout oneDNN's convolutions compute in, so they are not relaid out. w stays OIHW.
  bool channels_last = false;

  int64_t h_out() const { return (h + 2 * pad_h - dil_h * (kh - 1) - 1) / stride_h + 1; }
  int64_t w_out() const { return (w + 2 * pad_w - dil_w * (kw - 1) - 1) / stride_w + 1; }
};

// The dtype of y, dx, dw and the bias for operands of `operands`: float64 for float64, float32 otherwise.
inline DType conv2d_output_dtype(DType operands) {
  return operands == DType::Float64 ? DType::Float64 : DType::Float32;
}

// Throws naming `what` when the shape is not a valid convolution (non-positive sizes, groups not dividing
// both channel counts, negative padding, an output with no rows/columns, a dtype other than f32/f64/bf16/f16).
// The op layer (core/ops/conv.cc) checks the same with tensor shapes in its messages; both backends call
// this first so a kernel never runs on a shape it cannot handle.
inline void check_conv2d_shape(const char* what, const Conv2dShape& s) {
  DPE_CHECK(s.dtype == DType::Float32 || s.dtype == DType::Float64 || s.dtype == DType::BFloat16 ||
                s.dtype == DType::Float16,
            what, ": dtype ", s.dtype, " is not float32, float64, bfloat16 or float16");
  DPE_CHECK(s.n >= 0 && s.c_in > 0 && s.h > 0 && s.w > 0 && s.c_out > 0 && s.kh > 0 && s.kw > 0, what,
            ": sizes must be positive (N may be 0): N ", s.n, ", C_in ", s.c_in, ", H ", s.h, ", W ", s.w, ", C_out ",
            s.c_out, ", kH ", s.kh, ", kW ", s.kw);
  DPE_CHECK(s.stride_h > 0 && s.stride_w > 0 && s.dil_h > 0 && s.dil_w > 0 && s.pad_h >= 0 && s.pad_w >= 0, what,
            ": stride (", s.stride_h, ", ", s.stride_w, ") and dilation (", s.dil_h, ", ", s.dil_w,
            ") must be positive, padding (", s.pad_h, ", ", s.pad_w, ") non-negative");
  DPE_CHECK(!s.f32_activations || s.dtype == DType::BFloat16, what, ": float32 activations go with bfloat16 operands "
            "only, got dtype ", s.dtype);
  DPE_CHECK(s.groups > 0 && s.c_in % s.groups == 0 && s.c_out % s.groups == 0, what, ": groups ", s.groups,
            " must divide C_in ", s.c_in, " and C_out ", s.c_out);
  DPE_CHECK(s.h + 2 * s.pad_h >= s.dil_h * (s.kh - 1) + 1 && s.w + 2 * s.pad_w >= s.dil_w * (s.kw - 1) + 1, what,
            ": padded input (", s.h + 2 * s.pad_h, ", ", s.w + 2 * s.pad_w, ") is smaller than the dilated kernel (",
            s.dil_h * (s.kh - 1) + 1, ", ", s.dil_w * (s.kw - 1) + 1, ")");
}

// y = conv2d(x, w) + b.   x: (N, C_in, H, W)  w: (C_out, C_in/g, kH, kW)  b: (C_out) or null
//                         y: (N, C_out, H_out, W_out)
void conv2d_forward_cpu(const Conv2dShape& s, const void* x, const void* w, const void* b, void* y);
// dx = conv2d's input gradient.   dy: (N, C_out, H_out, W_out)  w: (C_out, C_in/g, kH, kW)  dx: (N, C_in, H, W)
void conv2d_backward_data_cpu(const Conv2dShape& s, const void* dy, const void* w, void* dx);
// dw = conv2d's weight gradient.  x: (N, C_in, H, W)  dy: (N, C_out, H_out, W_out)  dw: (C_out, C_in/g, kH, kW)
void conv2d_backward_weight_cpu(const Conv2dShape& s, const void* x, const void* dy, void* dw);
// Both gradients in one call (dx or dw null: not wanted), as the two above; dy is reordered into oneDNN's
// layout once when both passes chose the same one. db (C_out), with dw only, for float32 convolutions and
// bfloat16 ones on float32 activations, else null: the bias gradient sum(dy over N, H_out, W_out), made in
// float32 by the backward-weights pass from the dy it reads (for bfloat16, dy rounded to bfloat16).
void conv2d_backward_cpu(const Conv2dShape& s, const void* x, const void* w, const void* dy, void* dx, void* dw,
                         void* db);

// CUDA: `device` is the logical CUDA device (its cuDNN handle and caching allocator, for the workspace);
// `stream` is its compute stream (cuda::stream(device)), on which everything is enqueued.
void conv2d_forward_cuda(cudaStream_t stream, int device, const Conv2dShape& s, const void* x, const void* w,
                         const void* b, void* y);
void conv2d_backward_data_cuda(cudaStream_t stream, int device, const Conv2dShape& s, const void* dy, const void* w,
                               void* dx);
void conv2d_backward_weight_cuda(cudaStream_t stream, int device, const Conv2dShape& s, const void* x,
                                 const void* dy, void* dw);

}  // namespace dpe::kernels
