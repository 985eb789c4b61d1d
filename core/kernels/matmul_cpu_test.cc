// gemm_cpu against a triple loop in double: every transpose combination, padded leading dimensions,
// alpha/beta, empty sizes, batches with broadcast (stride 0) operands, and BLAS's beta == 0 / k == 0 rules;
// float32 with each library forced and with the measured choice (core/kernels/sgemm_choice.h), and
// DPE_CPU_SGEMM's parsing.
#include <gtest/gtest.h>
#include <omp.h>
#include <stdlib.h>

#include <cblas.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <limits>
#include <set>
#include <thread>
#include <vector>

#include "core/cpu_isa.h"
#include "core/error.h"
#include "core/kernels/matmul.h"
#include "core/kernels/onednn.h"
#include "core/kernels/primitive_cache.h"
#include "core/kernels/sgemm_choice.h"
#include "tests/testing/errors.h"
#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {
namespace {

// Element (i, j) of op(M) where M is stored row-major with row stride ld.
template <typename T>
double op_at(const T* m, int64_t ld, Transpose t, int64_t i, int64_t j) {
  return t == Transpose::No ? m[i * ld + j] : m[j * ld + i];
}

// A gemm problem with its own storage; C starts as random values.
template <typename T>
struct Problem {
  GemmArgs args;
  std::vector<T> a, b, c, c_initial;

  Problem(int64_t m, int64_t n, int64_t k, Transpose ta, Transpose tb, double alpha, double beta, int64_t pad = 0,
          int64_t batch = 1, bool broadcast_a = false, bool broadcast_b = false) {
    GemmArgs& g = args;
    g.dtype = dtype_of<T>();
    g.trans_a = ta;
    g.trans_b = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.beta = beta;
    const int64_t a_rows = ta == Transpose::No ? m : k, a_cols = ta == Transpose::No ? k : m;
    const int64_t b_rows = tb == Transpose::No ? k : n, b_cols = tb == Transpose::No ? n : k;
    g.lda = a_cols + pad;
    g.ldb = b_cols + pad;
    g.ldc = n + pad;
    g.batch = batch;
    g.stride_a = broadcast_a ? 0 : a_rows * g.lda;
    g.stride_b = broadcast_b ? 0 : b_rows * g.ldb;
    g.stride_c = m * g.ldc;
    a = random_vector<T>((broadcast_a ? 1 : batch) * a_rows * g.lda, -1.0, 1.0, 1);
    b = random_vector<T>((broadcast_b ? 1 : batch) * b_rows * g.ldb, -1.0, 1.0, 2);
    c = random_vector<T>(batch * m * g.ldc, -1.0, 1.0, 3);
    c_initial = c;
    g.a = a.data();
    g.b = b.data();
    g.c = c.data();
  }

  // Compares c with alpha * op(A) op(B) + beta * C0 in double; padding columns must be untouched.
  void check(const std::string& label) const {
    const GemmArgs& g = args;
    // Rounding: k products summed in T, bounded by k * eps * sum |a||b| (blocked sums are far better).
    const double eps = std::numeric_limits<T>::epsilon();
    for (int64_t p = 0; p < g.batch; ++p) {
      const T* ap = a.data() + p * g.stride_a;
      const T* bp = b.data() + p * g.stride_b;
      for (int64_t i = 0; i < g.m; ++i) {
        for (int64_t j = 0; j < g.ldc; ++j) {
          const int64_t ci = p * g.stride_c + i * g.ldc + j;
          if (j >= g.n) {
            ASSERT_EQ(c[ci], c_initial[ci]) << label << ": padding overwritten at " << i << "," << j;
            continue;
          }
          double dot = 0, magnitude = 0;
          for (int64_t q = 0; q < g.k; ++q) {
            const double prod = op_at(ap, g.lda, g.trans_a, i, q) * op_at(bp, g.ldb, g.trans_b, q, j);
            dot += prod;
            magnitude += std::fabs(prod);
          }
          const double old_term = g.beta == 0 ? 0.0 : g.beta * c_initial[ci];  // beta 0: C may hold NaN
          const double want = g.alpha * dot + old_term;
          const double bound =
              4 * eps * (std::fabs(g.alpha) * magnitude * std::sqrt(double(g.k) + 1) + std::fabs(old_term) + 1e-30);
          ASSERT_NEAR(c[ci], want, bound) << label << ": batch " << p << " at " << i << "," << j;
        }
      }
    }
  }
};

template <typename T>
class GemmCpu : public ::testing::Test {};
TYPED_TEST_SUITE(GemmCpu, FloatTypes);

const Transpose kTrans[] = {Transpose::No, Transpose::Yes};

TYPED_TEST(GemmCpu, AllTransposesSizesAndScalars) {
  struct Size {
    int64_t m, n, k;
  };
  const Size sizes[] = {{1, 1, 1}, {7, 5, 3}, {1, 9, 4}, {6, 1, 7}, {33, 17, 65}, {128, 96, 200}, {5, 300, 1}};
  const double scalars[][2] = {{1, 0}, {0.5, 2}, {-1.5, 1}};
  for (const Size& s : sizes) {
    for (Transpose ta : kTrans) {
      for (Transpose tb : kTrans) {
        for (const auto& ab : scalars) {
          for (int64_t pad : {0, 3}) {
            Problem<TypeParam> p(s.m, s.n, s.k, ta, tb, ab[0], ab[1], pad);
            gemm_cpu(p.args);
            p.check(::testing::PrintToString(std::vector<int64_t>{s.m, s.n, s.k, ta == Transpose::Yes,
                                                                tb == Transpose::Yes, pad}));
          }
        }
      }
    }
  }
}

TYPED_TEST(GemmCpu, IntegerValuedProductsAreExact) {
  using T = TypeParam;
  // (2, 3) @ (3, 2): every partial sum is a small integer, exact in any summation order.
  const std::vector<T> a = {1, 2, 3, 4, 5, 6}, b = {7, 8, 9, 10, 11, 12};
  std::vector<T> c = {100, 200, 300, 400};
  GemmArgs g;
  g.dtype = dtype_of<T>();
  g.m = 2, g.n = 2, g.k = 3;
  g.a = a.data(), g.lda = 3;
  g.b = b.data(), g.ldb = 2;
  g.c = c.data(), g.ldc = 2;
  g.beta = 1;
  gemm_cpu(g);
  EXPECT_EQ(c, (std::vector<T>{158, 264, 439, 554}));
  // A^T @ B^T with A stored (3, 2) and B stored (2, 3): same product as [1 3 5; 2 4 6] @ [7 9; 8 10; ...].
  g.trans_a = Transpose::Yes, g.trans_b = Transpose::Yes;
  g.lda = 2, g.ldb = 3;
  g.beta = 0;
  gemm_cpu(g);  // op(A) = [[1,3,5],[2,4,6]], op(B) = [[7,10],[8,11],[9,12]]
  EXPECT_EQ(c, (std::vector<T>{76, 103, 100, 136}));
}

TYPED_TEST(GemmCpu, BetaZeroIgnoresNaNInC) {
  using T = TypeParam;
  for (int64_t k : {0, 1, 64}) {
    Problem<T> p(9, 7, k, Transpose::No, Transpose::No, 1.0, 0.0);
    std::fill(p.c.begin(), p.c.end(), std::numeric_limits<T>::quiet_NaN());
    p.c_initial = p.c;
    gemm_cpu(p.args);
    for (int64_t i = 0; i < 9 * 7; ++i) ASSERT_FALSE(std::isnan(p.c[i])) << "k " << k << " at " << i;
    p.check("beta 0, k " + std::to_string(k));
  }
}

TYPED_TEST(GemmCpu, KZeroOrAlphaZeroScalesC) {
  using T = TypeParam;
  Problem<T> p(4, 5, 0, Transpose::No, Transpose::Yes, 1.0, 2.0, 2, 3);
  gemm_cpu(p.args);
  p.check("k 0, beta 2, batch 3");
  // alpha == 0: A and B are not read (BLAS semantics), so a NaN there does not reach C.
  Problem<T> q(4, 5, 6, Transpose::No, Transpose::No, 0.0, 1.0);
  std::fill(q.a.begin(), q.a.end(), std::numeric_limits<T>::quiet_NaN());
  gemm_cpu(q.args);
  EXPECT_EQ(q.c, q.c_initial);
}

TYPED_TEST(GemmCpu, EmptySizesDoNothing) {
  using T = TypeParam;
  for (auto [m, n, k] : {std::tuple{0, 3, 4}, std::tuple{3, 0, 4}, std::tuple{0, 0, 0}}) {
    Problem<T> p(m, n, k, Transpose::No, Transpose::No, 1.0, 0.0);
    gemm_cpu(p.args);
    EXPECT_EQ(p.c, p.c_initial);
  }
  Problem<T> p(3, 3, 3, Transpose::No, Transpose::No, 1.0, 0.0, 0, /*batch=*/0);
  gemm_cpu(p.args);
}

TYPED_TEST(GemmCpu, BatchedWithBroadcastOperands) {
  for (Transpose ta : kTrans) {
    for (Transpose tb : kTrans) {
      Problem<TypeParam> both(5, 6, 7, ta, tb, 1.0, 0.5, 1, 4);
      gemm_cpu(both.args);
      both.check("batched");
      Problem<TypeParam> shared_b(5, 6, 7, ta, tb, 1.0, 0.0, 0, 4, false, true);  // x[b] @ W
      gemm_cpu(shared_b.args);
      shared_b.check("stride_b 0");
      Problem<TypeParam> shared_a(8, 3, 2, ta, tb, 2.0, 1.0, 2, 3, true, false);
      gemm_cpu(shared_a.args);
      shared_a.check("stride_a 0");
    }
  }
}

TYPED_TEST(GemmCpu, LargeEnoughForLibraryThreading) {
  Problem<TypeParam> p(256, 512, 784, Transpose::No, Transpose::No, 1.0, 0.0);
  gemm_cpu(p.args);
  p.check("mlp forward");
  Problem<TypeParam> q(784, 512, 256, Transpose::Yes, Transpose::No, 1.0, 1.0);
  gemm_cpu(q.args);
  q.check("mlp weight gradient, accumulated");
}

// bfloat16 A and B, float32 C (autocast's products): checked like float32 on the rounded operands, since the
// product of two bfloat16 values is exact in float32 and only the float32 accumulation rounds. On AVX-512
// (emulated without bfloat16 instructions: this test's avx512 cap); below it an error (the avx2 cap).
TEST(GemmCpuBf16, AllTransposesScalarsAndBatchesOnRoundedOperands) {
  if (cpu_isa() < CpuIsa::Avx512) {
    Problem<float> p(2, 2, 2, Transpose::No, Transpose::No, 1.0, 0.0);
    const std::vector<BFloat16> ab(8);
    p.args.dtype = DType::BFloat16;
    p.args.a = p.args.b = ab.data();
    EXPECT_NE(dpe::testing::error_of([&] { gemm_cpu(p.args); })
                  .find("gemm_cpu: bfloat16 operands need AVX-512 (oneDNN 2.6 has no AVX2 bfloat16 matmul); dpe runs "
                        "avx2 ("),
              std::string::npos);
    return;
  }
  struct Size {
    int64_t m, n, k;
  };
  const Size sizes[] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {128, 96, 200}};
  const double scalars[][2] = {{1, 0}, {0.5, 2}};
  for (const Size& s : sizes) {
    for (Transpose ta : kTrans) {
      for (Transpose tb : kTrans) {
        for (const auto& ab : scalars) {
          for (int64_t batch : {1, 3}) {
            Problem<float> p(s.m, s.n, s.k, ta, tb, ab[0], ab[1], /*pad=*/batch == 1 ? 2 : 0, batch,
                             /*broadcast_a=*/false, /*broadcast_b=*/batch > 1);
            std::vector<BFloat16> a16, b16;
            for (float& v : p.a) v = bfloat16_to_float(a16.emplace_back(float_to_bfloat16(v)));
            for (float& v : p.b) v = bfloat16_to_float(b16.emplace_back(float_to_bfloat16(v)));
            p.args.dtype = DType::BFloat16;
            p.args.a = a16.data();
            p.args.b = b16.data();
            gemm_cpu(p.args);
            p.check(::testing::PrintToString(std::vector<int64_t>{s.m, s.n, s.k, ta == Transpose::Yes,
                                                                tb == Transpose::Yes, batch}));
          }
        }
      }
    }
  }
}

TEST(GemmCpuErrors, RejectsBadArguments) {
  Problem<float> p(4, 5, 6, Transpose::No, Transpose::No, 1.0, 0.0);
  GemmArgs g = p.args;
  g.lda = 5;  // < k
  EXPECT_THROW(gemm_cpu(g), Error);
  g = p.args;
  g.trans_b = Transpose::Yes;  // stored B is now (5, 6): ldb 5 < 6
  EXPECT_THROW(gemm_cpu(g), Error);
  g = p.args;
  g.ldc = 4;
  EXPECT_THROW(gemm_cpu(g), Error);
  g = p.args;
  g.dtype = DType::Float16;
  EXPECT_NE(dpe::testing::error_of([&] { gemm_cpu(g); }).find("float16 operands are CUDA-only"), std::string::npos);
  g = p.args;
  g.m = -1;
  EXPECT_THROW(gemm_cpu(g), Error);
  g = p.args;
  g.batch = 2;
  g.stride_c = 0;  // both batches would write the same C
  EXPECT_THROW(gemm_cpu(g), Error);
}

// ---------------------------------------------------------------------------------------------------------
// float32: which library runs the product (Note [float32 GEMM choice] in sgemm_cpu.cc).

// `policy` for the scope, then DPE_CPU_SGEMM's again.
struct ForcedSgemm {
  explicit ForcedSgemm(SgemmPolicy policy) { set_sgemm_policy(policy); }
  ~ForcedSgemm() { clear_sgemm_policy(); }
};

std::string policy_label(SgemmPolicy policy) { return std::string(sgemm_policy_name(policy)); }

// Every policy (each library forced, the default's rule, the measured choice) keeps the tolerances every
// float32 test here uses.
TEST(SgemmBackends, EveryPolicyMeetsTheTolerance) {
  const std::vector<SgemmPolicy> policies(std::begin(kSgemmPolicies), std::end(kSgemmPolicies));
  struct Size {
    int64_t m, n, k;
  };
  const Size sizes[] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {128, 96, 200}, {5, 300, 1}, {64, 10, 256}};
  const double scalars[][2] = {{1, 0}, {0.5, 2}, {-1.5, 1}};
  for (const auto& policy : policies) {
    ForcedSgemm forced(policy);
    for (const Size& s : sizes) {
      for (Transpose ta : kTrans) {
        for (Transpose tb : kTrans) {
          for (const auto& ab : scalars) {
            for (int64_t pad : {0, 3}) {
              Problem<float> p(s.m, s.n, s.k, ta, tb, ab[0], ab[1], pad, /*batch=*/2, false, pad == 3);
              gemm_cpu(p.args);
              p.check(policy_label(policy) + " " +
                      ::testing::PrintToString(std::vector<int64_t>{s.m, s.n, s.k, ta == Transpose::Yes,
                                                                  tb == Transpose::Yes, pad}));
            }
          }
        }
      }
    }
    Problem<float> nan_c(9, 7, 64, Transpose::No, Transpose::Yes, 1.0, 0.0);
    std::fill(nan_c.c.begin(), nan_c.c.end(), std::numeric_limits<float>::quiet_NaN());
    nan_c.c_initial = nan_c.c;
    gemm_cpu(nan_c.args);
    nan_c.check(policy_label(policy) + ": beta 0 ignores NaN in C");
  }
}

// The libraries agree with each other on the MLP's shapes (forward, weight and input gradients) within the
// float32 bound: the same check against double, so any two differ by at most twice it.
TEST(SgemmBackends, ForcedBackendsAgreeOnTheMlpShapes) {
  struct Shape {
    int64_t m, n, k;
    Transpose ta, tb;
    double beta;
  };
  const Shape shapes[] = {{256, 512, 784, Transpose::No, Transpose::No, 0.0},
                          {784, 512, 256, Transpose::Yes, Transpose::No, 1.0},
                          {256, 784, 512, Transpose::No, Transpose::Yes, 0.0},
                          {256, 10, 512, Transpose::No, Transpose::No, 0.0}};
  for (const Shape& s : shapes) {
    std::vector<std::vector<float>> results;
    for (SgemmBackend b : kSgemmBackends) {
      ForcedSgemm forced(forcing(b));
      Problem<float> p(s.m, s.n, s.k, s.ta, s.tb, 1.0, s.beta);
      gemm_cpu(p.args);
      p.check(std::string(sgemm_backend_name(b)) + " " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
              std::to_string(s.k));
      results.push_back(p.c);
    }
    // Each against the first library: within 1e-3 relative (the double-reference bound above is the strict
    // check; this one says the libraries answer the same question).
    for (size_t r = 1; r < results.size(); ++r) {
      for (size_t i = 0; i < results[0].size(); ++i) {
        ASSERT_NEAR(results[r][i], results[0][i], 1e-3 * (1 + std::fabs(results[0][i])))
            << sgemm_backend_name(kSgemmBackends[r]) << " vs " << sgemm_backend_name(kSgemmBackends[0]) << " at "
            << i;
      }
    }
  }
}

TEST(SgemmBackends, PolicyParsing) {
  for (SgemmPolicy p : kSgemmPolicies) EXPECT_EQ(parse_sgemm_policy(sgemm_policy_name(p)), p);
  EXPECT_EQ(parse_sgemm_policy("onednn"), SgemmPolicy::Onednn);
  EXPECT_EQ(parse_sgemm_policy("auto"), SgemmPolicy::Auto);
  EXPECT_EQ(forced_backend(SgemmPolicy::Onednn), std::nullopt);
  EXPECT_EQ(forced_backend(SgemmPolicy::Auto), std::nullopt);
  for (SgemmBackend b : kSgemmBackends) {
    EXPECT_EQ(forced_backend(forcing(b)), b);
    EXPECT_EQ(sgemm_policy_name(forcing(b)), sgemm_backend_name(b));
  }
  EXPECT_EQ(sgemm_backend_name(SgemmBackend::OnednnSgemm), "onednn-sgemm");
  EXPECT_EQ(sgemm_backend_name(SgemmBackend::OnednnMatmul), "onednn-matmul");
  EXPECT_EQ(sgemm_backend_name(SgemmBackend::OpenBlas), "openblas");
  for (const char* bad : {"", "Auto", "oneDNN", "onednn-gemm", "OpenBLAS", "mkl", "openblas ", "auto,openblas"}) {
    const std::string want = std::string("DPE_CPU_SGEMM='") + bad +
                             "' is not a float32 GEMM policy; expected onednn, auto, onednn-sgemm, onednn-matmul or "
                             "openblas";
    const std::string got = dpe::testing::error_of([&] { parse_sgemm_policy(bad); });
    EXPECT_NE(got.find(want), std::string::npos) << got;
  }
}

// DPE_CPU_SGEMM is read on every product: a bad value fails the float32 GEMM naming it (float64 does not
// read it); unset or empty is the default, "onednn".
TEST(SgemmBackends, EnvironmentVariable) {
  Problem<float> p(4, 5, 6, Transpose::No, Transpose::No, 1.0, 0.0);
  ASSERT_EQ(setenv("DPE_CPU_SGEMM", "fastest", 1), 0);
  const std::string got = dpe::testing::error_of([&] { gemm_cpu(p.args); });
  EXPECT_NE(got.find("DPE_CPU_SGEMM='fastest' is not a float32 GEMM policy"), std::string::npos) << got;
  Problem<double> d(4, 5, 6, Transpose::No, Transpose::No, 1.0, 0.0);
  gemm_cpu(d.args);
  d.check("float64 ignores DPE_CPU_SGEMM");
  {
    ForcedSgemm forced(SgemmPolicy::OnednnMatmul);  // set_sgemm_policy wins over the variable
    gemm_cpu(p.args);
    p.check("forced over a bad DPE_CPU_SGEMM");
  }
  for (SgemmPolicy policy : kSgemmPolicies) {
    ASSERT_EQ(setenv("DPE_CPU_SGEMM", std::string(sgemm_policy_name(policy)).c_str(), 1), 0);
    EXPECT_EQ(sgemm_policy_from_env(), policy);
    EXPECT_EQ(current_sgemm_policy(), policy);
    gemm_cpu(p.args);
    p.check("DPE_CPU_SGEMM=" + policy_label(policy));
  }
  ASSERT_EQ(setenv("DPE_CPU_SGEMM", "", 1), 0);
  EXPECT_EQ(sgemm_policy_from_env(), SgemmPolicy::Onednn);
  ASSERT_EQ(unsetenv("DPE_CPU_SGEMM"), 0);
  EXPECT_EQ(sgemm_policy_from_env(), SgemmPolicy::Onednn);
  EXPECT_EQ(kDefaultSgemmPolicy, SgemmPolicy::Onednn);
  EXPECT_EQ(current_sgemm_policy(), SgemmPolicy::Onednn);
}

// The default policy's rule: the matmul primitive for A @ B^T of at least kMatmulPrimitiveFlops per matrix
// (nn::Linear's forward), dnnl_sgemm for every other layout and for small products.
TEST(SgemmBackends, OnednnRuleByLayoutAndSize) {
  auto rule = [](int64_t m, int64_t n, int64_t k, Transpose ta, Transpose tb, int64_t batch = 1) {
    GemmArgs g;
    g.m = m, g.n = n, g.k = k, g.trans_a = ta, g.trans_b = tb, g.batch = batch;
    return onednn_rule(g);
  };
  const auto No = Transpose::No, Yes = Transpose::Yes;
  EXPECT_EQ(rule(256, 512, 784, No, Yes), SgemmBackend::OnednnMatmul);  // the MLP's first Linear
  EXPECT_EQ(rule(256, 512, 784, No, No), SgemmBackend::OnednnSgemm);    // its input gradient's layout
  EXPECT_EQ(rule(512, 784, 256, Yes, No), SgemmBackend::OnednnSgemm);   // its weight gradient
  EXPECT_EQ(rule(256, 512, 784, Yes, Yes), SgemmBackend::OnednnSgemm);
  EXPECT_EQ(rule(100, 100, 1000, No, Yes), SgemmBackend::OnednnMatmul);  // exactly 2e7 FLOP
  EXPECT_EQ(rule(100, 100, 999, No, Yes), SgemmBackend::OnednnSgemm);
  EXPECT_EQ(rule(64, 64, 32, No, Yes, 64), SgemmBackend::OnednnSgemm);  // attention scores: per matrix
  EXPECT_EQ(kMatmulPrimitiveFlops, 2e7);
}

// Under the default policy a large A @ B^T runs on the matmul primitive and the other layouts on dnnl_sgemm:
// their bits equal the forced library's (and the two libraries' bits differ on these shapes, so the check
// can tell them apart).
TEST(SgemmBackends, DefaultPolicyRunsTheRulesLibrary) {
  struct Case {
    Transpose ta, tb;
    SgemmBackend want;
  };
  for (const Case& c : {Case{Transpose::No, Transpose::Yes, SgemmBackend::OnednnMatmul},
                        Case{Transpose::No, Transpose::No, SgemmBackend::OnednnSgemm},
                        Case{Transpose::Yes, Transpose::No, SgemmBackend::OnednnSgemm}}) {
    auto product = [&](SgemmPolicy policy) {
      ForcedSgemm forced(policy);
      Problem<float> p(96, 128, 1000, c.ta, c.tb, 1.0, 0.0);  // 2.5e7 FLOP
      gemm_cpu(p.args);
      return p.c;
    };
    const std::vector<float> by_default = product(SgemmPolicy::Onednn);
    const std::vector<float> sgemm = product(SgemmPolicy::OnednnSgemm), matmul = product(SgemmPolicy::OnednnMatmul);
    // They do under AVX2 (oneDNN's avx2 kernels sum in the same order both ways); the other ISAs' runs check.
    if (sgemm == matmul) GTEST_SKIP() << "dnnl_sgemm and the matmul primitive agree bit for bit on " <<
                                         cpu_isa_description() << ": the test cannot tell them apart";
    EXPECT_EQ(by_default, c.want == SgemmBackend::OnednnMatmul ? matmul : sgemm)
        << "expected " << sgemm_backend_name(c.want) << " for trans_a " << (c.ta == Transpose::Yes) << ", trans_b "
        << (c.tb == Transpose::Yes);
  }
}

// Shapes that keep changing (here 300 batch sizes through the matmul primitive) keep at most
// kPrimitiveCacheCapacity primitives, and a shape evicted and met again is built again, with the same bits.
TEST(SgemmBackends, MatmulPrimitivesAreBounded) {
  ForcedSgemm forced(SgemmPolicy::OnednnMatmul);
  Problem<float> first(1, 48, 40, Transpose::No, Transpose::Yes, 1.0, 0.0);
  gemm_cpu(first.args);
  for (int64_t m = 2; m < 2 + static_cast<int64_t>(detail::kPrimitiveCacheCapacity) + 44; ++m) {
    Problem<float> p(m, 48, 40, Transpose::No, Transpose::Yes, 1.0, 0.0);
    gemm_cpu(p.args);
    if (m % 50 == 0) p.check("m " + std::to_string(m));
  }
  EXPECT_EQ(detail::onednn_matmul_primitives_cached(), detail::kPrimitiveCacheCapacity);
  Problem<float> again(1, 48, 40, Transpose::No, Transpose::Yes, 1.0, 0.0);  // evicted long ago
  gemm_cpu(again.args);
  EXPECT_EQ(again.c, first.c);
}

// The measured choice is recorded once per (shape, thread share), names every eligible candidate with a
// positive figure, and OpenBLAS only where it would run on the calling thread. Many threads meeting a new
// shape at once wait for one measurement and all get correct products.
TEST(SgemmBackends, ChoiceIsMeasuredOncePerShapeAndRecorded) {
  ForcedSgemm automatic(SgemmPolicy::Auto);
  const int64_t m = 37, n = 41, k = 43;  // a shape no other test uses
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Problem<float>>> problems;
  for (int t = 0; t < 4; ++t) {
    problems.push_back(std::make_unique<Problem<float>>(m, n, k, Transpose::Yes, Transpose::No, 1.0, 0.0));
  }
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      omp_set_num_threads(1);
      gemm_cpu(problems[t]->args);
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& p : problems) p->check("concurrent first use");
  int found = 0;
  for (const SgemmChoice& c : sgemm_choices()) {
    if (c.m != m || c.n != n || c.k != k || c.trans_a != Transpose::Yes || c.trans_b != Transpose::No) continue;
    ++found;
    EXPECT_EQ(c.threads, 1);
    std::set<SgemmBackend> measured;
    for (const auto& [backend, gflops] : c.gflops) {
      EXPECT_GT(gflops, 0) << sgemm_backend_name(backend);
      measured.insert(backend);
    }
    EXPECT_TRUE(measured.count(SgemmBackend::OnednnSgemm) && measured.count(SgemmBackend::OnednnMatmul));
    EXPECT_EQ(measured.count(SgemmBackend::OpenBlas), openblas_get_num_threads() == 1 ? 1u : 0u);
    EXPECT_TRUE(measured.count(c.backend)) << "chose " << sgemm_backend_name(c.backend) << ", not measured";
  }
  EXPECT_EQ(found, 1) << "one measurement for the shape";
}

// Note [Small GEMMs on one thread]: tiny-llama's products at batch 1 run on one thread; its attention's batched
// products at batch 16, its projections at batch 64 and the MLP's on the caller's share; the caller's OpenMP
// setting survives the call.
TEST(GemmCpu, SmallProductsRunOnTheCallingThreadAlone) {
  std::thread([] {
    omp_set_num_threads(2);
    GemmArgs g;
    g.m = 64, g.n = 384, g.k = 128;  // 6.3 MFLOP: a feed-forward projection at batch 1
    EXPECT_EQ(detail::gemm_threads(g), 1);
    g.m = 64 * 64;  // 403 MFLOP: at batch 64
    EXPECT_EQ(detail::gemm_threads(g), 2);
    g.m = 64, g.n = 64, g.k = 32, g.batch = 4;  // attention scores at batch 1: 4 heads, 1 MFLOP
    EXPECT_EQ(detail::gemm_threads(g), 1);
    g.batch = 64;  // at batch 16: 17 MFLOP in one call
    EXPECT_EQ(detail::gemm_threads(g), 2);
    g.m = 128, g.n = 512, g.k = 784, g.batch = 1;  // the MLP's first layer on one device
    EXPECT_EQ(detail::gemm_threads(g), 2);

    Problem<float> small(64, 384, 128, Transpose::No, Transpose::Yes, 1.0, 0.0);
    gemm_cpu(small.args);
    small.check("a small product on one thread");
    EXPECT_EQ(omp_get_max_threads(), 2);
  }).join();
}

// Note [Small matrices of a batch in parallel]: on a two-thread share, each small matrix of a batch is one
// thread's work, so its bits are those of the same matrix on a one-thread share. 1 x 64 x 50000 (6.4 MFLOP
// each, 26 MFLOP in all) is a shape oneDNN 2.6's sgemm sums differently on two threads than on one (checked
// outside dpe): run matrix by matrix on the two-thread share, as before the note, this test fails.
TEST(GemmCpu, SmallMatricesOfABatchRunWholeOnOneThreadEach) {
  constexpr int64_t kBatch = 4;
  Problem<float> batched(1, 64, 50000, Transpose::No, Transpose::No, 1.0, 0.0, 0, kBatch);
  std::thread([&] {
    omp_set_num_threads(2);
    tbb::task_arena(2).execute([&] { gemm_cpu(batched.args); });
    EXPECT_EQ(omp_get_max_threads(), 2) << "the caller's OpenMP setting survives";
  }).join();
  batched.check("a batch of small matrices on two threads");
  for (int64_t p = 0; p < kBatch; ++p) {
    GemmArgs one = batched.args;
    one.batch = 1;
    one.a = batched.a.data() + p * one.stride_a;
    one.b = batched.b.data() + p * one.stride_b;
    std::vector<float> c(static_cast<size_t>(one.m * one.ldc));
    one.c = c.data();
    std::thread([&] {
      omp_set_num_threads(1);
      gemm_cpu(one);
    }).join();
    for (size_t i = 0; i < c.size(); ++i) {
      EXPECT_EQ(c[i], batched.c[static_cast<size_t>(p * one.stride_c) + i]) << "matrix " << p << " element " << i;
    }
  }
}

}  // namespace
}  // namespace dpe::kernels
