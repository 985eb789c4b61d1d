// 2-d pooling over NCHW (PyTorch's max_pool2d, avg_pool2d, adaptive_avg_pool2d), forward and backward.
//
// Layouts (contiguous, dtype float32 or float64): x, dx: (planes, H, W) with planes = N * C;
// y, dy: (planes, H_out, W_out); indices: int64 (planes, H_out, W_out), each the flat offset i * W + j of
// the maximum inside its plane (PyTorch's return_indices convention).
//
// Semantics (PyTorch's, ceil_mode = False, dilation 1):
//   max:  padding counts as -inf; the first maximum in row-major window order wins; a NaN wins (propagates).
//   avg:  count_include_pad = True: the divisor is the window clipped to the padded input, (hend - hstart) *
//         (wend - wstart) with hend = min(hstart + kH, H + pad_h), before clipping to the real input.
//   adaptive avg: output cell (oi, oj) averages rows [floor(oi H / H_out), ceil((oi + 1) H / H_out)) and
//         likewise columns.
// Contract: outputs are overwritten (=). Backward kernels gather: each dx element sums the dy of the
// windows that contain it, in increasing (oi, oj) order, so results are deterministic on both backends
// and the CPU and CUDA sums run in the same order.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"
#include "core/kernels/backend_types.h"

namespace dpe::kernels {

struct Pool2dShape {
  DType dtype = DType::Float32;
  int64_t planes = 0, h = 0, w = 0;  // input
  int64_t h_out = 0, w_out = 0;
  int64_t kh = 1, kw = 1;            // window (max / avg)
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  // The window-code kernels only: x, y, codes, dy and dx are channels last, (N, H, W, C) in memory with
  // planes = N * C (Note [Memory formats], core/tensor.h).
  bool channels_last = false;
  int64_t c = 1;  // C, when channels_last
  // The window-code kernels' forward (CPU) and the CUDA max-pool forward only: y = relu(max) (x <= 0 -> +0, NaN
  // kept, as relu's kernel), and where relu's gradient is 0 the code is kNoWinner (the index kNoWinnerIndex),
  // so the backward gives the window no gradient: relu(max_pool2d) and its gradient, bit for bit, in one pass.
  bool relu = false;
};

// A window code whose window gets no gradient (max_pool2d_2x2_cpu with relu).
inline constexpr uint8_t kNoWinner = 4;
// An index whose window gets no gradient (max_pool2d_cuda with relu).
inline constexpr int64_t kNoWinnerIndex = -1;

// Output size of a window pool: (H + 2 pad - k) / stride + 1 (floor).
inline int64_t pool_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad) {
  return (in + 2 * pad - k) / stride + 1;
}

// Window pools: positive sizes, pad <= k / 2 (PyTorch's rule), output size as pool_out_size.
inline void check_pool2d_shape(const char* what, const Pool2dShape& s) {
  DPE_CHECK(s.dtype == DType::Float32 || s.dtype == DType::Float64, what, ": dtype ", s.dtype,
            " is not float32 or float64");
  DPE_CHECK(s.planes >= 0 && s.h > 0 && s.w > 0 && s.kh > 0 && s.kw > 0 && s.stride_h > 0 && s.stride_w > 0, what,
            ": sizes must be positive: planes ", s.planes, ", H ", s.h, ", W ", s.w, ", kernel (", s.kh, ", ", s.kw,
            "), stride (", s.stride_h, ", ", s.stride_w, ")");
  DPE_CHECK(s.pad_h >= 0 && s.pad_w >= 0 && 2 * s.pad_h <= s.kh && 2 * s.pad_w <= s.kw, what, ": padding (",
            s.pad_h, ", ", s.pad_w, ") must be >= 0 and at most half the kernel (", s.kh, ", ", s.kw, ")");
  DPE_CHECK(s.h_out == pool_out_size(s.h, s.kh, s.stride_h, s.pad_h) && s.h_out > 0 &&
                s.w_out == pool_out_size(s.w, s.kw, s.stride_w, s.pad_w) && s.w_out > 0,
            what, ": output (", s.h_out, ", ", s.w_out, ") does not match input (", s.h, ", ", s.w, ")");
}

// Adaptive pools: only planes, h, w, h_out, w_out are used; all positive (planes may be 0).
inline void check_adaptive_shape(const char* what, const Pool2dShape& s) {
  DPE_CHECK(s.dtype == DType::Float32 || s.dtype == DType::Float64, what, ": dtype ", s.dtype,
            " is not float32 or float64");
  DPE_CHECK(s.planes >= 0 && s.h > 0 && s.w > 0 && s.h_out > 0 && s.w_out > 0, what,
            ": sizes must be positive: planes ", s.planes, ", input (", s.h, ", ", s.w, "), output (", s.h_out, ", ",
            s.w_out, ")");
}

// x: (P, H, W)  y, indices: (P, H_out, W_out)
void max_pool2d_cpu(const Pool2dShape& s, const void* x, void* y, int64_t* indices);
// dy, indices: (P, H_out, W_out)  dx: (P, H, W)
void max_pool2d_backward_cpu(const Pool2dShape& s, const void* dy, const int64_t* indices, void* dx);
// Note [Window codes]
// MaxPool2d(2) on CPU float32 (kernel 2, stride 2, no padding: the CNN's pools and most others) can save,
// instead of int64 indices, one uint8 code per output: the winner's place in its window, 2 * row + column
// (0..3). The forward writes an eighth of the index bytes, and the backward writes each dx element once from
// dy and the codes, where the scatter through indices zero-fills dx and then writes it again: in the CNN's
// step the two pools' index writes, zero fills and scatters were the largest of dpe's own kernels (profile in
// docs/BENCHMARKS.md). max_pool2d saves codes where max_pool2d_2x2_applies; max_pool2d_with_indices, whose
// indices the caller sees, keeps int64 (PyTorch's convention). Same values and gradients bit for bit.
// Channels-last tensors (s.channels_last) take these kernels too: there a window's four candidates are four
// rows of C channels, compared eight channels at a time.
bool max_pool2d_2x2_applies(const Pool2dShape& s);
// x: (P, H, W)  y, codes: (P, H_out, W_out), or their channels-last orders; s as max_pool2d_2x2_applies.
void max_pool2d_2x2_cpu(const Pool2dShape& s, const void* x, void* y, uint8_t* codes);
// dy, codes: (P, H_out, W_out)  dx: (P, H, W), or their channels-last orders; every dx element written (0 where
// no window's winner is).
void max_pool2d_2x2_backward_cpu(const Pool2dShape& s, const void* dy, const uint8_t* codes, void* dx);

// x: (P, H, W)  y: (P, H_out, W_out)
void avg_pool2d_cpu(const Pool2dShape& s, const void* x, void* y);
// dy: (P, H_out, W_out)  dx: (P, H, W)
void avg_pool2d_backward_cpu(const Pool2dShape& s, const void* dy, void* dx);
// x: (P, H, W)  y: (P, H_out, W_out)
void adaptive_avg_pool2d_cpu(const Pool2dShape& s, const void* x, void* y);
// dy: (P, H_out, W_out)  dx: (P, H, W)
void adaptive_avg_pool2d_backward_cpu(const Pool2dShape& s, const void* dy, void* dx);

void max_pool2d_cuda(cudaStream_t stream, const Pool2dShape& s, const void* x, void* y, int64_t* indices);
void max_pool2d_backward_cuda(cudaStream_t stream, const Pool2dShape& s, const void* dy, const int64_t* indices,
                              void* dx);
void avg_pool2d_cuda(cudaStream_t stream, const Pool2dShape& s, const void* x, void* y);
void avg_pool2d_backward_cuda(cudaStream_t stream, const Pool2dShape& s, const void* dy, void* dx);
void adaptive_avg_pool2d_cuda(cudaStream_t stream, const Pool2dShape& s, const void* x, void* y);
void adaptive_avg_pool2d_backward_cuda(cudaStream_t stream, const Pool2dShape& s, const void* dy, void* dx);

}  // namespace dpe::kernels
