// relu(max_pool2d(conv2d(x, w, b), 2)) in one pass each way on CPU, for a network's first convolution: few
// products per output (C_in * kH * kW <= kConvPoolMaxProducts), stride 1, no dilation or groups, float32.
//
// Note [Convolution, ReLU and pool in one pass]
// A first convolution (the CNN's 1 -> 32 channels, 3x3, on 28x28 images) has the model's largest activation and
// the least arithmetic per element: 9 products per output. Composed, its output (6.4 MB per 64 images) was
// written by the convolution, read by the pool, its gradient written by the pool's backward and read again by
// the weight gradient, and oneDNN's kernels for one input channel ran at a quarter of the FMA peak. Here each
// 2x2 window's four convolution outputs are computed in registers, output channels in vector lanes (8 on AVX2,
// 16 on AVX-512: Note [AVX-512 where the CPU has it] in conv_pool_cpu.cc), and only the pooled values and their
// window codes are stored; the backward reads the pooled gradient and the codes and multiplies each window's
// gradient with the inputs under its winner alone.
//
// Layouts: x (N, C_in, H, W), NCHW or channels last (s.channels_last); w (C_out, C_in, kH, kW) contiguous; b
// (C_out) or null; y and dy (N, C_out, H_p, W_p) in x's format, H_p = H_conv / 2 and W_p = W_conv / 2 (floor,
// as MaxPool2d(2)), H_conv and W_conv the convolution's output (s.h_out(), s.w_out()); codes: uint8 (N, H_p,
// W_p, C_out) in either format, the window codes of Note [Window codes] (core/kernels/pool.h).
//
// Semantics. Each convolution output is its products in (ci, kh, kw) order, each fused into the running sum
// (fma) from 0, then + b: one order for any layout and thread count, not oneDNN's (the composition's last bits
// differ). The pool is max_pool2d's (the first maximum in window order wins, a NaN wins), then relu (x <= 0 ->
// +0, the window gets no gradient), as max_pool2d_relu. Backward: dw[co, ci, kh, kw] is the sum over every
// window with a winner of dy * (the input under the winner's tap), db[co] the sum of those dy; each sample's
// sums in (row, column) order, the samples' sums added in sample order, so the bits do not depend on the
// thread count. A window without a winner adds nothing, where the composition adds 0 * x: they differ only when
// an input is infinite or NaN (when the forward is not finite either).
// Contract: outputs are overwritten (=); dw and db may be null (not wanted), and x with dw.
#pragma once

#include <cstdint>

#include "core/kernels/conv.h"

namespace dpe::kernels {

// Products per convolution output above which oneDNN's convolution is the faster path.
inline constexpr int64_t kConvPoolMaxProducts = 32;

// The pooled output's rows and columns: (H_conv / 2, W_conv / 2).
inline int64_t conv_pool_h(const Conv2dShape& s) { return s.h_out() / 2; }
inline int64_t conv_pool_w(const Conv2dShape& s) { return s.w_out() / 2; }

// Whether the kernels below take this convolution (followed by ReLU and MaxPool2d(2)): float32 without
// autocast, stride 1, dilation 1, groups 1, at most kConvPoolMaxProducts products per output, a convolution
// output of at least 2x2, at least one sample, and an AVX2 build.
bool conv2d_relu_max_pool2d_applies(const Conv2dShape& s);

// y = relu(max_pool2d(conv2d(x, w) + b, 2)), codes its window codes. s as conv2d_relu_max_pool2d_applies.
void conv2d_relu_max_pool2d_cpu(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                                uint8_t* codes);
// dw (C_out, C_in, kH, kW) and db (C_out) from dy (y's gradient), the forward's codes and its input x.
void conv2d_relu_max_pool2d_backward_cpu(const Conv2dShape& s, const float* x, const float* dy, const uint8_t* codes,
                                         float* dw, float* db);

}  // namespace dpe::kernels
