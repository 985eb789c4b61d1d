// Causal scaled dot-product attention on CPU, float32 (kernels/attention.h).
//
// Note [Attention one head at a time]
// Composed of tensor ops, attention writes its (B, H, T, T) scores to memory and passes over them four times each
// way (the scale, the mask, the softmax; their backward), and a permuted view of heads (v, and the output on its
// way back to (B, T, H * d)) is copied into contiguous memory each way: for tiny-llama (T = 64, d = 32, 512
// heads a step) 8 MB of scores per layer and as many copies of activations. Here each (batch, head) matrix is one
// task: the T x T scores of one head (16 KB at T = 64) are computed into that head's slice of the probabilities
// kept for the backward, scaled, masked and normalised row by row while they are in cache, and multiplied by v at
// once; q, k, v, out and their gradients are read and written where they lie (a row stride per operand). Every
// product is one GEMM call on the task's thread (gemm_cpu_one_thread: dnnl_sgemm for these shapes), in the
// composition's orientation (the same transposes, so the same kernel and order of sums on any ISA), as the
// composition's bmm gives a head's product to one thread (Note [Small matrices of a batch in parallel] in
// matmul_cpu.cc), and every elementwise step rounds as
// the composition's op does (the scale as affine's fma, the mask as an add of 0 or -inf, softmax_row_cpu), so the
// results are the composition's bit for bit where the GEMM library's sums do not depend on the row strides
// (dnnl_sgemm's do not: core/ops/attention_test.cc, run under every instruction-set cap) nor on a thread count (a head under kOneThreadFlops runs on
// one thread in the composition too; a larger one may be split there).
#include "core/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/matmul.h"
#include "core/kernels/scratch.h"
#include "core/kernels/softmax.h"

namespace dpe::kernels {
namespace {

// C (m, n) = op(A) (m, k) @ op(B) (k, n) on the calling thread, float32, row-major with row strides.
void product(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, Transpose ta, const float* b, int64_t ldb,
             Transpose tb, float* c, int64_t ldc) {
  gemm_cpu_one_thread(
      {.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .a = a, .lda = lda, .b = b, .ldb = ldb, .c = c, .ldc = ldc});
}

float* matrix(const MatrixBatch& m, int64_t i) { return m.data + m.offsets[i]; }

// Work per head, for the task split: the products' multiply-adds.
int64_t head_work(const AttentionShape& s) { return 2 * s.T * s.T * std::max<int64_t>(1, s.d); }

}  // namespace

void causal_attention_forward_cpu(const AttentionShape& s, MatrixBatch q, MatrixBatch k, MatrixBatch v, float* probs,
                                  MatrixBatch out) {
  const int64_t T = s.T, d = s.d;
  if (s.count == 0 || T == 0) return;
  const float scale = static_cast<float>(s.scale);
  const float masked = -std::numeric_limits<float>::infinity();
  detail::parallel_tasks(s.count, head_work(s), [&](int64_t i) {
    float* p = probs + i * T * T;
    product(T, T, d, matrix(q, i), q.ld, Transpose::No, matrix(k, i), k.ld, Transpose::Yes, p, T);
    for (int64_t r = 0; r < T; ++r) {
      float* row = p + r * T;
      for (int64_t j = 0; j < T; ++j) row[j] = std::fma(scale, row[j], 0.0f) + (j > r ? masked : 0.0f);
      softmax_row_cpu(T, row, row);
    }
    product(T, d, T, p, T, Transpose::No, matrix(v, i), v.ld, Transpose::No, matrix(out, i), out.ld);
  });
}

void causal_attention_backward_cpu(const AttentionShape& s, MatrixBatch q, MatrixBatch k, MatrixBatch v,
                                   const float* probs, MatrixBatch dout, MatrixBatch dq, MatrixBatch dk,
                                   MatrixBatch dv) {
  const int64_t T = s.T, d = s.d;
  if (s.count == 0 || T == 0) return;
  const float scale = static_cast<float>(s.scale);
  detail::parallel_tasks(s.count, 2 * head_work(s), [&](int64_t i) {
    const float* p = probs + i * T * T;
    const size_t bytes = static_cast<size_t>(T * T + d * T) * sizeof(float);
    const detail::ScratchBuffer buffer = detail::scratch(bytes);  // dP, then dS: T x T; dK^T: d x T
    DPE_CHECK_WITH(ErrorKind::OutOfMemory, buffer != nullptr,
                   "causal_attention_backward_cpu: out of memory for a head's ", T, " x ", T, " scores and ", d, " x ",
                   T, " key gradient (", bytes, " bytes)");
    float* ds = static_cast<float*>(buffer.get());
    float* dk_t = ds + T * T;
    product(T, d, T, p, T, Transpose::Yes, matrix(dout, i), dout.ld, Transpose::No, matrix(dv, i), dv.ld);
    product(T, T, d, matrix(dout, i), dout.ld, Transpose::No, matrix(v, i), v.ld, Transpose::Yes, ds, T);
    for (int64_t r = 0; r < T; ++r) {
      float* row = ds + r * T;
      softmax_backward_row_cpu(T, p + r * T, row, row);
      for (int64_t j = 0; j < T; ++j) row[j] = std::fma(scale, row[j], 0.0f);
    }
    product(T, d, T, ds, T, Transpose::No, matrix(k, i), k.ld, Transpose::No, matrix(dq, i), dq.ld);
    // dK as the composition's bmm backward makes it, q^T dS (d x T), then transposed: dK = dS^T q would be the
    // same sums, but GEMM kernels may order them differently by orientation (oneDNN's AVX2 sgemm does).
    product(d, T, T, matrix(q, i), q.ld, Transpose::Yes, ds, T, Transpose::No, dk_t, T);
    float* dk_i = matrix(dk, i);
    for (int64_t j = 0; j < T; ++j) {
      for (int64_t e = 0; e < d; ++e) dk_i[j * dk.ld + e] = dk_t[e * T + j];
    }
  });
}

}  // namespace dpe::kernels
