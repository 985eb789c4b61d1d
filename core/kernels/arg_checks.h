// Argument checks shared by the CPU and CUDA kernels (host code), so that both backends reject the same
// calls with the same words. `what` names the kernel ("binary_cpu", "softmax_cuda", ...) and starts every
// message. Each check throws dpe::Error (DPE_CHECK) on the first violated condition, in the order below.
// Private to core/kernels.
#pragma once

#include <cstdint>

#include "core/error.h"
#include "core/kernels/batch_norm.h"
#include "core/kernels/layout.h"
#include "core/kernels/matmul.h"
#include "core/kernels/softmax.h"

namespace dpe::kernels::detail {

// An element count: n >= 0.
inline void check_n(const char* what, int64_t n) { DPE_CHECK(n >= 0, what, ": n = ", n, " is negative"); }

// (outer, size, inner) of a reduction or softmax axis: all >= 0.
inline void check_axis_dims(const char* what, int64_t outer, int64_t size, int64_t inner) {
  DPE_CHECK(outer >= 0 && size >= 0 && inner >= 0, what, ": negative dimension in (outer ", outer, ", size ", size,
            ", inner ", inner, ")");
}

// A batch-norm shape: N, C, S >= 0; with `needs_values` (the statistics) at least one value per channel.
inline void check_batch_norm_shape(const char* what, const BatchNormShape& s, bool needs_values = false) {
  DPE_CHECK(s.n >= 0 && s.c >= 0 && s.s >= 0, what, ": negative dimension in (N ", s.n, ", C ", s.c, ", S ", s.s,
            ")");
  DPE_CHECK(!needs_values || s.c == 0 || s.n * s.s > 0, what, ": no values per channel (N ", s.n, ", S ", s.s,
            ") to take statistics of");
}

// A known SoftmaxKind, then check_axis_dims.
inline void check_softmax_args(const char* what, SoftmaxKind kind, int64_t outer, int64_t size, int64_t inner) {
  DPE_CHECK(kind == SoftmaxKind::Softmax || kind == SoftmaxKind::LogSoftmax, what, ": unknown SoftmaxKind ",
            static_cast<int>(kind));
  check_axis_dims(what, outer, size, inner);
}

// One layout: ndim in [0, kMaxDims], sizes and strides >= 0. Messages start "<what><operand>:".
inline void check_layout(const Layout& l, const char* what, const char* operand) {
  DPE_CHECK(l.ndim >= 0 && l.ndim <= kMaxDims, what, operand, ": ndim ", l.ndim, " outside [0, ", kMaxDims, "]");
  for (int d = 0; d < l.ndim; ++d) {
    DPE_CHECK(l.sizes[d] >= 0 && l.strides[d] >= 0, what, operand, ": dimension ", d, " has size ", l.sizes[d],
              " and stride ", l.strides[d], "; both must be >= 0");
  }
}

// A copy's layouts: each valid (check_layout), same ndim and sizes.
inline void check_copy_layouts(const char* what, const Layout& src, const Layout& dst) {
  check_layout(src, what, " src");
  check_layout(dst, what, " dst");
  DPE_CHECK(src.ndim == dst.ndim, what, ": src has ", src.ndim, " dims, dst has ", dst.ndim);
  for (int d = 0; d < src.ndim; ++d) {
    DPE_CHECK(src.sizes[d] == dst.sizes[d], what, ": dimension ", d, " has size ", src.sizes[d], " in src and ",
              dst.sizes[d], " in dst");
  }
}

// An RMSNorm's (rows, d): rows >= 0 and d > 0.
inline void check_rms_norm_shape(const char* what, int64_t rows, int64_t d) {
  DPE_CHECK(rows >= 0 && d > 0, what, ": rows = ", rows, ", d = ", d, "; expected rows >= 0 and d > 0");
}

// The strided operand of a rotary embedding: (..., T, d) with d even and > 0 and last stride 1.
inline void check_rotary_layout(const char* what, const Layout& x) {
  DPE_CHECK(x.ndim >= 2 && x.ndim <= kMaxDims, what, ": the strided operand has ", x.ndim,
            " dims; expected (..., T, d)");
  const int64_t d = x.sizes[x.ndim - 1];
  DPE_CHECK(d > 0 && d % 2 == 0 && x.strides[x.ndim - 1] == 1, what, ": the strided operand's last dim has size ", d,
            " and stride ", x.strides[x.ndim - 1], "; expected an even size > 0 and stride 1");
}

// A binary op's layouts: same ndim (<= kMaxDims) and sizes (>= 0), strides >= 0, out contiguous.
inline void check_binary_layouts(const char* what, const Layout& out, const Layout& a, const Layout& b) {
  DPE_CHECK(out.ndim >= 0 && out.ndim <= kMaxDims, what, ": ndim ", out.ndim, " outside [0, ", kMaxDims, "]");
  DPE_CHECK(a.ndim == out.ndim && b.ndim == out.ndim, what, ": out has ", out.ndim, " dims, a has ", a.ndim,
            ", b has ", b.ndim);
  for (int d = 0; d < out.ndim; ++d) {
    DPE_CHECK(out.sizes[d] >= 0, what, ": out dimension ", d, " has size ", out.sizes[d]);
    DPE_CHECK(a.sizes[d] == out.sizes[d] && b.sizes[d] == out.sizes[d], what, ": dimension ", d, " has size ",
              out.sizes[d], " in out, ", a.sizes[d], " in a, ", b.sizes[d], " in b");
    DPE_CHECK(a.strides[d] >= 0 && b.strides[d] >= 0, what, ": dimension ", d, " has stride ", a.strides[d],
              " in a and ", b.strides[d], " in b; strides must be >= 0");
  }
  DPE_CHECK(out.is_contiguous(), what, ": out must be contiguous");
}

// GemmArgs' sizes, strides and pointers (not its dtype: each backend checks that where it dispatches).
// Pointers and leading dimensions are only checked where they are read: C unless the output is empty,
// A and B unless k == 0.
inline void check_gemm_args(const char* what, const GemmArgs& g) {
  DPE_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0, what, ": negative size in m ", g.m, ", n ", g.n,
            ", k ", g.k, ", batch ", g.batch);
  DPE_CHECK(g.stride_a >= 0 && g.stride_b >= 0 && g.stride_c >= 0, what, ": negative batch stride in (",
            g.stride_a, ", ", g.stride_b, ", ", g.stride_c, ")");
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  DPE_CHECK(g.c != nullptr, what, ": C is null for m ", g.m, ", n ", g.n);
  DPE_CHECK(g.ldc >= g.n, what, ": ldc ", g.ldc, " < n ", g.n);
  DPE_CHECK(g.batch == 1 || g.stride_c >= (g.m - 1) * g.ldc + g.n, what, ": C matrices overlap across the ",
            g.batch, " batches: stride_c ", g.stride_c, " for m ", g.m, ", n ", g.n, ", ldc ", g.ldc);
  if (g.k == 0) return;
  const int64_t a_cols = g.trans_a == Transpose::No ? g.k : g.m;
  const int64_t b_cols = g.trans_b == Transpose::No ? g.n : g.k;
  DPE_CHECK(g.a != nullptr && g.b != nullptr, what, ": A or B is null for m ", g.m, ", n ", g.n, ", k ", g.k);
  DPE_CHECK(g.lda >= a_cols, what, ": lda ", g.lda, " < ", a_cols, " columns of the stored A (m ", g.m, ", k ", g.k,
            ", trans_a ", g.trans_a == Transpose::Yes, ")");
  DPE_CHECK(g.ldb >= b_cols, what, ": ldb ", g.ldb, " < ", b_cols, " columns of the stored B (k ", g.k, ", n ", g.n,
            ", trans_b ", g.trans_b == Transpose::Yes, ")");
}

}  // namespace dpe::kernels::detail
