// CPU GEMM: float32 on oneDNN (dnnl_sgemm, or its matmul primitive or OpenBLAS by policy: Note [float32 GEMM
// choice] in sgemm_cpu.cc); bfloat16 operands on oneDNN's matmul primitive (float32 C); float64 on OpenBLAS
// cblas_dgemm (gradient checks only, where its speed does not matter). Nothing hand-written.
//
// Threads: oneDNN parallelises with OpenMP using omp_get_max_threads() of the *calling* thread, so each
// device worker sets its share with omp_set_num_threads() once (see docs/DESIGN.md), and products too small
// to share run on the calling thread alone (Note [Small GEMMs on one thread]); OpenBLAS uses its own
// process-wide pthread pool (openblas_set_num_threads), which is why it is a float32 candidate only for
// one-thread shares with a one-thread pool (it then runs on the calling worker). The libraries never run on
// TBB; only the small matrices of a batch are spread over the caller's TBB arena, one matrix per task on one
// thread (Note [Small matrices of a batch in parallel]). Apart from the float32 choice and oneDNN primitives,
// cached once per shape behind a mutex, gemm_cpu keeps no state: concurrent calls on distinct C matrices are
// safe. A batch stride of 0 on A or B is safe (they are only read); C must not overlap across batches.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <optional>
#include <type_traits>

#include "core/cpu_isa.h"
#include "core/error.h"
#include "core/kernels/arg_checks.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/matmul.h"
#include "core/kernels/onednn.h"
#include "core/kernels/sgemm_choice.h"

namespace dpe::kernels {
namespace {

// C = beta * C, where beta == 0 writes zeros whatever C held (NaN included): what BLAS does when
// alpha == 0 or k == 0.
// c: (m, n) with row stride ldc.
template <typename T>
void scale_c(int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
  if (beta == T(1)) return;
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0)) {
      std::fill(row, row + n, T(0));
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
}

// The dtype first, then detail::check_gemm_args: the same checks and words as gemm_cuda.
void check_args(const GemmArgs& g) {
  DPE_CHECK(g.dtype != DType::Float16, "gemm_cpu: float16 operands are CUDA-only (oneDNN 2.6 has no float16 "
            "matmul on CPU); use bfloat16 on CPU");
  DPE_CHECK(g.dtype == DType::Float32 || g.dtype == DType::Float64 || g.dtype == DType::BFloat16, "gemm_cpu: dtype ",
            g.dtype, " is not float32, float64 or bfloat16");
  // Only autocast multiplies bfloat16 on CPU, and only where the CPU has bfloat16 instructions.
  DPE_CHECK(g.dtype != DType::BFloat16 || cpu_isa() >= CpuIsa::Avx512, "gemm_cpu: bfloat16 operands need AVX-512 "
            "(oneDNN 2.6 has no AVX2 bfloat16 matmul); dpe runs ", cpu_isa_description(), " here");
  detail::check_gemm_args("gemm_cpu", g);
}

CBLAS_TRANSPOSE cblas_trans(Transpose t) { return t == Transpose::Yes ? CblasTrans : CblasNoTrans; }

void dgemm(const GemmArgs& g, const double* a, const double* b, double* c) {
  // cblas takes 32-bit ints (Debian's libopenblas0 is the LP64 build).
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc}) {
    DPE_CHECK(v <= INT_MAX, "gemm_cpu: float64 sizes and leading dimensions must fit in int; got ", v);
  }
  cblas_dgemm(CblasRowMajor, cblas_trans(g.trans_a), cblas_trans(g.trans_b), static_cast<int>(g.m),
              static_cast<int>(g.n), static_cast<int>(g.k), g.alpha, a, static_cast<int>(g.lda), b,
              static_cast<int>(g.ldb), g.beta, c, static_cast<int>(g.ldc));
}

// bfloat16 A and B, float32 C: oneDNN's matmul primitive, one matrix at a time.
void gemm_batched_bf16(const GemmArgs& g) {
  const auto* a = static_cast<const BFloat16*>(g.a);
  const auto* b = static_cast<const BFloat16*>(g.b);
  float* c = static_cast<float*>(g.c);
  for (int64_t i = 0; i < g.batch; ++i) {
    float* ci = c + i * g.stride_c;
    if (g.k == 0 || g.alpha == 0.0) {
      scale_c(g.m, g.n, static_cast<float>(g.beta), ci, g.ldc);
    } else {
      detail::onednn_matmul(g, a + i * g.stride_a, b + i * g.stride_b, ci);
    }
  }
}

// Note [Small GEMMs on one thread]
// oneDNN starts an OpenMP team of omp_get_max_threads() for every call, however small. Waking threads that
// have gone to sleep costs more than a small product takes on one core; within one batched call the threads
// stay awake from one matrix to the next. So a call whose products add up to less than kOneThreadFlops runs
// on the calling thread alone (its OpenMP setting restored afterwards). tiny-llama on one CPU device with both
// cores (dpe bench --model tiny-llama --modes single-all), ms per step before / after: batch 1 6.8-8.6 /
// 3.5, batch 4 10.7-11.7 / 8.7-9.6, batch 16 24.8-27.5 / 25.5-27.3 (its attention's 64 products of 64 x 64
// x 32 are one call of 17 MFLOP: two threads, as before); the MLP at batch 256 unchanged (docs/BENCHMARKS.md).
// A product under the threshold has one thread's bits whatever the device's share of cores (oneDNN's GEMM
// may split K over threads, which rounds differently).
constexpr double kOneThreadFlops = 1e7;  // ~60 us on one core

class OneOmpThread {
 public:
  OneOmpThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneOmpThread() { omp_set_num_threads(saved_); }
  OneOmpThread(const OneOmpThread&) = delete;
  OneOmpThread& operator=(const OneOmpThread&) = delete;

 private:
  int saved_;
};

// Note [Small matrices of a batch in parallel]
// A batch of matrices each under kOneThreadFlops (attention's per-head products) whose sum is over it ran one
// matrix after another, each split by oneDNN over the share's threads: a 64 x 64 x 32 product split in two
// spends much of its time starting and joining. Now such a batch (dnnl_sgemm, the default for these shapes)
// gives whole matrices to the caller's TBB arena, each computed on one thread (its OpenMP setting 1 while it
// runs, so oneDNN starts no team from a TBB worker). Each matrix's bits are then one thread's whatever the
// share, as a product under the threshold already was. tiny-llama on one device with both cores (`dpe bench
// --model tiny-llama --modes single-all`, alternating binaries, ms per step before / after): batch 32 29.97,
// 29.07 / 28.00, 27.60; batch 16 16.21, 15.93 / 14.72, 14.63. Other backends (a forced one, the matmul
// primitive) keep the loop.
template <typename T>
void gemm_batched(const GemmArgs& g) {
  const T* a = static_cast<const T*>(g.a);
  const T* b = static_cast<const T*>(g.b);
  T* c = static_cast<T*>(g.c);
  // No product to add: C = beta * C without reading A or B (BLAS semantics; the libraries are not asked
  // about k == 0).
  const bool no_product = g.k == 0 || g.alpha == 0.0;
  SgemmBackend backend = SgemmBackend::OnednnSgemm;
  if constexpr (std::is_same_v<T, float>) {
    if (!no_product) backend = detail::choose_sgemm(g);  // once for the whole batch
    // Note [Small matrices of a batch in parallel]
    if (!no_product && backend == SgemmBackend::OnednnSgemm && g.batch > 1 && omp_get_max_threads() > 1 &&
        detail::matrix_flops(g) < kOneThreadFlops) {
      detail::parallel_tasks(g.batch, static_cast<int64_t>(detail::matrix_flops(g)), [&](int64_t i) {
        const OneOmpThread one_thread;
        detail::run_sgemm(backend, g, a + i * g.stride_a, b + i * g.stride_b, c + i * g.stride_c);
      });
      return;
    }
  }
  for (int64_t i = 0; i < g.batch; ++i) {
    T* ci = c + i * g.stride_c;
    if (no_product) {
      scale_c(g.m, g.n, static_cast<T>(g.beta), ci, g.ldc);
    } else if constexpr (std::is_same_v<T, float>) {
      detail::run_sgemm(backend, g, a + i * g.stride_a, b + i * g.stride_b, ci);
    } else {
      dgemm(g, a + i * g.stride_a, b + i * g.stride_b, ci);
    }
  }
}

}  // namespace

int detail::gemm_threads(const GemmArgs& g) {
  return matrix_flops(g) * static_cast<double>(g.batch) < kOneThreadFlops ? 1 : omp_get_max_threads();
}

// For b in [0, batch): C[b] (m, n) = alpha * op(A[b]) (m, k) @ op(B[b]) (k, n) + beta * C[b].
void gemm_cpu(const GemmArgs& args) {
  check_args(args);
  if (args.m == 0 || args.n == 0 || args.batch == 0) return;
  std::optional<OneOmpThread> one_thread;  // Note [Small GEMMs on one thread]
  if (detail::gemm_threads(args) < omp_get_max_threads()) one_thread.emplace();
  if (args.dtype == DType::Float32) {
    gemm_batched<float>(args);
  } else if (args.dtype == DType::BFloat16) {
    gemm_batched_bf16(args);
  } else {
    gemm_batched<double>(args);
  }
}

void gemm_cpu_one_thread(const GemmArgs& args) {
  const OneOmpThread one_thread;
  gemm_cpu(args);
}

void prepare_cpu_gemm() noexcept {
  static std::once_flag prepared;
  try {
    std::call_once(prepared, [] {  // not marked done if it throws: the first product then generates them
      const OneOmpThread one_thread;
      GemmArgs g;
      g.m = g.n = g.k = g.lda = g.ldb = g.ldc = 8;
      float a[64] = {}, b[64] = {}, c[64];
      detail::run_sgemm(SgemmBackend::OnednnSgemm, g, a, b, c);  // checks the address space first
    });
  } catch (...) {
  }
}

}  // namespace dpe::kernels
