// CPU GEMM: oneDNN's dnnl_sgemm for float32, OpenBLAS cblas_dgemm for float64. Nothing hand-written.
//
// Why two libraries: oneDNN JIT-compiles sgemm for the CPU it runs on (AVX2, AVX-512, ...), so float32
// speed does not depend on OPENBLAS_CORETYPE, which these machines force to Haswell. float64 is only used
// by gradient checks, where OpenBLAS's speed does not matter.
//
// Threads: dnnl_sgemm parallelises with OpenMP using omp_get_max_threads() of the *calling* thread, so each
// device worker sets its share with omp_set_num_threads() once (see docs/DESIGN.md); OpenBLAS uses its own
// pthread pool (openblas_set_num_threads). Neither uses TBB. gemm_cpu itself keeps no state: concurrent
// calls on distinct C matrices are safe.
// Batches run one after another, so a batch stride of 0 on A or B is safe; C must not overlap across
// batches.
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "core/error.h"
#include "core/kernels/arg_checks.h"
#include "core/kernels/matmul.h"
#include "core/kernels/onednn.h"

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
  DPE_CHECK(g.dtype == DType::Float32 || g.dtype == DType::Float64, "gemm_cpu: dtype ", g.dtype,
            " is not float32 or float64");
  detail::check_gemm_args("gemm_cpu", g);
}

char trans_char(Transpose t) { return t == Transpose::Yes ? 'T' : 'N'; }

CBLAS_TRANSPOSE cblas_trans(Transpose t) { return t == Transpose::Yes ? CblasTrans : CblasNoTrans; }

// a: op -> (m, k)  b: op -> (k, n)  c: (m, n), all row-major with the given row strides.
void sgemm(const GemmArgs& g, const float* a, const float* b, float* c) {
  // A C API, but C++ inside: what it throws (out of memory in its lazy initialisation or JIT buffers) is
  // turned into a dpe::Error here, and its status is checked after it returns (Note [Exceptions and oneDNN]).
  dnnl_status_t status = dnnl_success;
  try {
    status = dnnl_sgemm(trans_char(g.trans_a), trans_char(g.trans_b), g.m, g.n, g.k, static_cast<float>(g.alpha), a,
                        g.lda, b, g.ldb, static_cast<float>(g.beta), c, g.ldc);
  } catch (...) {
    detail::rethrow_onednn_failure("gemm_cpu", dpe::detail::str_cat("in dnnl_sgemm (m ", g.m, ", n ", g.n, ", k ", g.k, ")"));
  }
  // The arguments were validated above, so oneDNN rejecting them is our bug; anything else (out of
  // memory) is reported as an error.
  DPE_INTERNAL_ASSERT(status != dnnl_invalid_arguments, "dnnl_sgemm rejected m ", g.m, ", n ", g.n, ", k ", g.k,
                      ", lda ", g.lda, ", ldb ", g.ldb, ", ldc ", g.ldc);
  DPE_CHECK(status != dnnl_out_of_memory, "gemm_cpu: out of memory inside oneDNN (dnnl_sgemm returned ",
            dnnl_status2str(status), ") for m ", g.m, ", n ", g.n, ", k ", g.k);
  DPE_CHECK(status == dnnl_success, "dnnl_sgemm failed: ", dnnl_status2str(status), " (m ", g.m, ", n ", g.n,
            ", k ", g.k, ")");
}

void dgemm(const GemmArgs& g, const double* a, const double* b, double* c) {
  // cblas takes 32-bit ints (Debian's libopenblas0 is the LP64 build).
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc}) {
    DPE_CHECK(v <= INT_MAX, "gemm_cpu: float64 sizes and leading dimensions must fit in int; got ", v);
  }
  cblas_dgemm(CblasRowMajor, cblas_trans(g.trans_a), cblas_trans(g.trans_b), static_cast<int>(g.m),
              static_cast<int>(g.n), static_cast<int>(g.k), g.alpha, a, static_cast<int>(g.lda), b,
              static_cast<int>(g.ldb), g.beta, c, static_cast<int>(g.ldc));
}

template <typename T>
void gemm_batched(const GemmArgs& g) {
  const T* a = static_cast<const T*>(g.a);
  const T* b = static_cast<const T*>(g.b);
  T* c = static_cast<T*>(g.c);
  // No product to add: C = beta * C without reading A or B (BLAS semantics; the libraries are not asked
  // about k == 0).
  const bool no_product = g.k == 0 || g.alpha == 0.0;
  for (int64_t i = 0; i < g.batch; ++i) {
    T* ci = c + i * g.stride_c;
    if (no_product) {
      scale_c(g.m, g.n, static_cast<T>(g.beta), ci, g.ldc);
    } else if constexpr (std::is_same_v<T, float>) {
      sgemm(g, a + i * g.stride_a, b + i * g.stride_b, ci);
    } else {
      dgemm(g, a + i * g.stride_a, b + i * g.stride_b, ci);
    }
  }
}

}  // namespace

// For b in [0, batch): C[b] (m, n) = alpha * op(A[b]) (m, k) @ op(B[b]) (k, n) + beta * C[b].
void gemm_cpu(const GemmArgs& args) {
  check_args(args);
  if (args.m == 0 || args.n == 0 || args.batch == 0) return;
  if (args.dtype == DType::Float32) {
    gemm_batched<float>(args);
  } else {
    gemm_batched<double>(args);
  }
}

}  // namespace dpe::kernels
