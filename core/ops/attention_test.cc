// scaled_dot_product_attention: the fused causal CPU kernels against the composition they replace (float32,
// forward and backward, on attention's permuted views of heads and on contiguous tensors), the output's layout,
// float64 gradchecks of the composition (causal and with a mask), when the fused kernels apply, NaN, input
// errors; the CUDA kernels against the CPU's and against the float64 composition with grouped-query heads and
// padding in float32, bfloat16 and float16.
#include "core/ops/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/amp/autocast.h"
#include "core/autograd/grad_mode.h"
#include "core/ops.h"
#include "tests/testing/errors.h"
#include "tests/testing/gradcheck.h"

namespace dpe {
namespace {

using dpe::testing::error_of;

// (T, T): 0 on and below the diagonal, -inf above.
Tensor causal(int64_t T, DType dtype = DType::Float32) {
  std::vector<double> mask(static_cast<size_t>(T * T), 0.0);
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t j = i + 1; j < T; ++j) mask[static_cast<size_t>(i * T + j)] = -std::numeric_limits<double>::infinity();
  }
  return Tensor::from_vector(mask, {T, T}, TensorOptions(dtype));
}

// Causal attention as the tensor ops compose it (what attention computed before the fused kernels).
Tensor composed(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), d = q.size(3);
  Tensor scores = bmm(q.reshape({B * H, T, d}), k.reshape({B * H, T, d}).transpose(1, 2)) * (1.0 / std::sqrt(double(d)));
  Tensor probs = softmax(scores.view({B, H, T, T}) + causal(T), -1);
  return bmm(probs.reshape({B * H, T, T}), v.reshape({B * H, T, d})).view({B, H, T, d});
}

// attention's heads: (B, T, H, d) -> (B, H, T, d), a permuted view
Tensor heads(const Tensor& x) { return x.permute({0, 2, 1, 3}); }

Tensor leaf(const Tensor& t) { return t.detach().clone().set_requires_grad(true); }

// Rows of 1 (one visible key), 7, 33 (the softmax's exps eight at a time from 32), 64 (tiny-llama's) and 70;
// heads of 8 and 32 features; the operands as permuted views of (B, T, H, d) and as contiguous tensors. Bit for
// bit, forward and backward: every step rounds as the composition's op does, and dnnl_sgemm's sums do not
// depend on the operands' row strides.
TEST(ScaledDotProductAttentionTest, FusedMatchesTheComposition) {
  for (int64_t T : {1, 7, 33, 64, 70}) {
    for (int64_t d : {8, 32}) {
      for (bool permuted : {true, false}) {
        SCOPED_TRACE("T " + std::to_string(T) + ", d " + std::to_string(d) + (permuted ? ", heads" : ", contiguous"));
        const Shape shape = permuted ? Shape{2, T, 3, d} : Shape{2, 3, T, d};
        auto operand = [&](const Tensor& t) { return permuted ? heads(t) : t; };
        const Tensor q0 = randn(shape), k0 = randn(shape), v0 = randn(shape), dy = randn({2, 3, T, d});
        Tensor qa = leaf(q0), ka = leaf(k0), va = leaf(v0), qb = leaf(q0), kb = leaf(k0), vb = leaf(v0);
        ASSERT_TRUE(fused_causal_attention_applies(operand(qa), operand(ka), operand(va)));
        Tensor fused = scaled_dot_product_attention(operand(qa), operand(ka), operand(va), {}, /*is_causal=*/true);
        Tensor reference = composed(operand(qb), operand(kb), operand(vb));
        ASSERT_EQ(fused.shape(), (Shape{2, 3, T, d}));
        EXPECT_EQ(max_abs_diff(fused, reference), 0.0);
        fused.backward(dy);
        reference.backward(dy);
        EXPECT_EQ(max_abs_diff(qa.grad(), qb.grad()), 0.0);
        EXPECT_EQ(max_abs_diff(ka.grad(), kb.grad()), 0.0);
        EXPECT_EQ(max_abs_diff(va.grad(), vb.grad()), 0.0);
        // v's layout: the permute back to (B, T, H, d) is a view where v was one (one position is both).
        if (T > 1) {
          EXPECT_EQ(fused.permute({0, 2, 1, 3}).is_contiguous(), permuted);
          EXPECT_EQ(fused.is_contiguous(), !permuted);
        }
      }
    }
  }
}

// The composition's own path (float64 here) gives the same numbers with is_causal as with the causal mask.
TEST(ScaledDotProductAttentionTest, IsCausalIsTheCausalMask) {
  const Tensor q = randn({2, 5, 4}, DType::Float64), k = randn({2, 5, 4}, DType::Float64),
               v = randn({2, 5, 3}, DType::Float64);
  EXPECT_FALSE(fused_causal_attention_applies(q, k, v));
  EXPECT_EQ(max_abs_diff(scaled_dot_product_attention(q, k, v, {}, true),
                         scaled_dot_product_attention(q, k, v, causal(5, DType::Float64))),
            0.0);
}

TEST(ScaledDotProductAttentionTest, GradcheckCausalAndMasked) {
  Tensor q = testing::randn_leaf({2, 4, 3, 6}, 1), k = testing::randn_leaf({2, 4, 3, 6}, 2),
         v = testing::randn_leaf({2, 4, 3, 5}, 3);
  EXPECT_EQ(testing::gradcheck(
                [](const std::vector<Tensor>& in) {
                  return scaled_dot_product_attention(heads(in[0]), heads(in[1]), heads(in[2]), {}, true);
                },
                {q, k, v}),
            "");
  const Tensor mask = randn({3, 4, 4}, DType::Float64);  // broadcast over the batch
  Tensor k2 = testing::randn_leaf({2, 3, 4, 6}, 4), v2 = testing::randn_leaf({2, 3, 4, 5}, 5),
         q2 = testing::randn_leaf({2, 3, 4, 6}, 6);
  EXPECT_EQ(testing::gradcheck(
                [&](const std::vector<Tensor>& in) {
                  return scaled_dot_product_attention(in[0], in[1], in[2], mask, false, 0.3);
                },
                {q2, k2, v2}),
            "");
}

// The fused kernels scale as the composition does, whatever the scale.
TEST(ScaledDotProductAttentionTest, ExplicitScale) {
  const Tensor q = randn({2, 9, 4}), k = randn({2, 9, 4}), v = randn({2, 9, 4});
  Tensor fused = scaled_dot_product_attention(q, k, v, {}, true, 2.5);
  Tensor scores = bmm(q, k.transpose(1, 2)) * 2.5 + causal(9);
  EXPECT_LE(max_abs_diff(fused, bmm(softmax(scores, -1), v)), 1e-6);
}

// A NaN reaches what it reaches in the composition: the masked scores are added -inf, not dropped, so a NaN key
// poisons the queries that cannot see it too (NaN + -inf is NaN), as in PyTorch's composed attention.
TEST(ScaledDotProductAttentionTest, NaNLikeTheComposition) {
  Tensor k = randn({1, 1, 6, 4});
  k.narrow(2, 3, 1).fill_(std::nan(""));
  const Tensor q = randn({1, 1, 6, 4}), v = randn({1, 1, 6, 4});
  const std::vector<float> fused = scaled_dot_product_attention(q, k, v, {}, true).to_vector<float>();
  const std::vector<float> reference = composed(q, k, v).to_vector<float>();
  for (size_t i = 0; i < fused.size(); ++i) {
    EXPECT_TRUE(std::isnan(fused[i]) && std::isnan(reference[i])) << i;
  }
}

TEST(ScaledDotProductAttentionTest, WhereTheFusedKernelsApply) {
  const Tensor q = randn({2, 5, 4});
  EXPECT_TRUE(fused_causal_attention_applies(q, q, q));
  EXPECT_FALSE(fused_causal_attention_applies(q, q, randn({2, 5, 3})));  // E != Ev
  EXPECT_FALSE(fused_causal_attention_applies(q, randn({2, 6, 4}), randn({2, 6, 4})));  // L != S
  EXPECT_FALSE(fused_causal_attention_applies(zeros({2, 0, 4}), zeros({2, 0, 4}), zeros({2, 0, 4})));
  {
    // Autocast's bfloat16 products are the composition's to make. Where the CPU has no bfloat16 instructions
    // (or DPE_MAX_CPU_ISA hides them: this test's capped runs, core/BUILD) autocast stays float32, and the
    // fused kernels apply.
    amp::AutocastGuard autocast(DeviceKind::CPU);
    EXPECT_EQ(fused_causal_attention_applies(q, q, q), !amp::autocast_state().cpu.has_value());
    EXPECT_EQ(amp::autocast_state().cpu.has_value(), amp::cpu_supports_bf16());
  }
  {
    amp::AutocastGuard autocast(DeviceKind::CPU, std::nullopt, /*enabled=*/false);
    EXPECT_TRUE(fused_causal_attention_applies(q, q, q));
  }
  // No queries: an empty result.
  EXPECT_EQ(scaled_dot_product_attention(zeros({2, 0, 4}), zeros({2, 0, 4}), zeros({2, 0, 4}), {}, true).shape(),
            (Shape{2, 0, 4}));
}

TEST(ScaledDotProductAttentionTest, NoGraphWithoutGrad) {
  Tensor q = randn({1, 4, 8}).set_requires_grad(true);
  NoGradGuard no_grad;
  EXPECT_FALSE(scaled_dot_product_attention(q, q, q, {}, true).requires_grad());
}

TEST(ScaledDotProductAttentionTest, ErrorsNameTheShapes) {
  EXPECT_NE(error_of([] { scaled_dot_product_attention(zeros({4}), zeros({4}), zeros({4})); })
                .find("scaled_dot_product_attention: expected query (..., L, E), key (..., S, E) and value (..., S, "
                      "Ev) with the same leading dims, got [4], [4] and [4]"),
            std::string::npos);
  EXPECT_NE(error_of([] { scaled_dot_product_attention(zeros({2, 3, 4}), zeros({3, 3, 4}), zeros({3, 3, 4})); })
                .find("got [2, 3, 4], [3, 3, 4] and [3, 3, 4]"),
            std::string::npos);
  EXPECT_NE(error_of([] { scaled_dot_product_attention(zeros({3, 4}), zeros({5, 2}), zeros({5, 4})); })
                .find("got [3, 4], [5, 2] and [5, 4]"),
            std::string::npos);
  EXPECT_NE(error_of([] { scaled_dot_product_attention(zeros({3, 4}), zeros({3, 4}), zeros({3, 4}), zeros({3, 3}), true); })
                .find("attn_mask and is_causal together; pass one of them"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              scaled_dot_product_attention(zeros({3, 4}), zeros({3, 4}), zeros({3, 4}), {}, true,
                                           std::numeric_limits<double>::infinity());
            }).find("scale must be finite, got inf"),
            std::string::npos);
  EXPECT_NE(error_of([] { scaled_dot_product_attention(zeros({3, 4}), zeros({3, 4}, DType::Float64), zeros({3, 4})); })
                .find("(query and key): dtypes differ (float32 and float64)"),
            std::string::npos);
  EXPECT_NE(error_of([] { scaled_dot_product_attention(zeros({3, 4}), zeros({3, 4}), zeros({3, 4}),
                                                       zeros({3, 3}, DType::Float64)); })
                .find("(query and attn_mask): dtypes differ (float32 and float64)"),
            std::string::npos);
}

// The CUDA kernels with float32 products against the CPU's fused kernels: the same values to the sums' order.
TEST(ScaledDotProductAttentionTest, CudaMatchesTheFusedCpuKernels) {
  if (!dpe::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const Tensor q0 = randn({2, 64, 4, 32}), k0 = randn({2, 64, 4, 32}), v0 = randn({2, 64, 4, 32}),
               dy = randn({2, 4, 64, 32});
  Tensor qa = leaf(q0), ka = leaf(k0), va = leaf(v0);
  Tensor qb = q0.to(gpu).set_requires_grad(true), kb = k0.to(gpu).set_requires_grad(true),
         vb = v0.to(gpu).set_requires_grad(true);
  Tensor cpu = scaled_dot_product_attention(heads(qa), heads(ka), heads(va), {}, true);
  Tensor cuda = scaled_dot_product_attention(heads(qb), heads(kb), heads(vb), {}, true);
  EXPECT_LT(max_abs_diff(cuda.to(Device::cpu(0)), cpu), 1e-5);
  cpu.backward(dy);
  cuda.backward(dy.to(gpu));
  EXPECT_LT(max_abs_diff(qb.grad().to(Device::cpu(0)), qa.grad()), 1e-4);
  EXPECT_LT(max_abs_diff(kb.grad().to(Device::cpu(0)), ka.grad()), 1e-4);
  EXPECT_LT(max_abs_diff(vb.grad().to(Device::cpu(0)), va.grad()), 1e-4);
}

// (B, T) key_keep: sequence b's first b + 1 keys and every key t % 7 == 3 are padding, so its first b + 1
// queries see no key at all.
std::vector<double> padding_pattern(int64_t B, int64_t T) {
  std::vector<double> keep(static_cast<size_t>(B * T), 1.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      if (t <= b || t % 7 == 3) keep[static_cast<size_t>(b * T + t)] = 0.0;
    }
  }
  return keep;
}

// fused_causal_attention as the composition computes it, on the CPU in float64: key/value head h / (H / Hkv)
// repeated for each query head h, key j hidden from query i where j > i or keep[b, j] == 0, the rows with no
// visible key zeroed. keep: (B * T) values, or empty for none.
Tensor reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<double>& keep) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), d = q.size(3), Hkv = k.size(1), n = H / Hkv;
  auto repeat = [&](const Tensor& t) { return t.unsqueeze(2).expand({B, Hkv, n, T, d}).reshape({B, H, T, d}); };
  std::vector<double> add(static_cast<size_t>(B * T * T)), rows(static_cast<size_t>(B * T), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j < T; ++j) {
        const bool visible = j <= i && (keep.empty() || keep[static_cast<size_t>(b * T + j)] != 0.0);
        add[static_cast<size_t>((b * T + i) * T + j)] = visible ? 0.0 : -std::numeric_limits<double>::infinity();
        if (visible) rows[static_cast<size_t>(b * T + i)] = 1.0;
      }
      if (rows[static_cast<size_t>(b * T + i)] == 0.0) {  // a finite softmax, zeroed below
        std::fill_n(add.begin() + (b * T + i) * T, T, 0.0);
      }
    }
  }
  const TensorOptions f64(DType::Float64);
  const Tensor mask = Tensor::from_vector(add, {B, 1, T, T}, f64);
  return scaled_dot_product_attention(q, repeat(k), repeat(v), mask) * Tensor::from_vector(rows, {B, 1, T, 1}, f64);
}

// |a - reference| / max |reference|, a on any device, in float64.
double relative_error(const Tensor& a, const Tensor& reference) {
  const Tensor x = a.to(Device::cpu(0)).to(DType::Float64);
  return max_abs_diff(x, reference) / std::max(1e-30, max_abs_diff(reference, zeros_like(reference)));
}

struct CudaAttentionCase {
  int64_t B, H, Hkv, T, d;
  bool padded;
};

// The CUDA kernels forward and backward against the float64 composition, on the layer's permuted views of
// (B, T, heads, d): multi-head and grouped-query heads (read in place), padding keys with rows that see no key,
// T across and within the 64-row tiles, d padded to the products' 16. float32 products agree to the sums'
// order; bfloat16 and float16 (autocast) to their roundings of q, k, v, P, dout and dS, relative to the largest
// value. The backward runs twice: the same bits (no atomics).
TEST(FusedCausalAttentionTest, CudaMatchesTheCompositionInEveryPrecision) {
  if (!dpe::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  struct Precision {
    std::optional<DType> autocast;
    double tolerance;
    std::vector<CudaAttentionCase> cases;
  };
  const std::vector<Precision> precisions = {
      {std::nullopt,
       1e-5,
       {{2, 3, 3, 1, 8, false},
        {2, 3, 3, 17, 24, false},
        {2, 4, 2, 64, 64, true},
        {1, 4, 1, 100, 32, true},
        {2, 2, 2, 130, 96, false},
        {1, 2, 2, 200, 64, true}}},
      {DType::BFloat16, 4e-2, {{2, 4, 2, 130, 64, true}, {1, 2, 2, 70, 128, false}, {2, 12, 12, 256, 64, false}}},
      {DType::Float16, 1e-2, {{2, 4, 2, 130, 64, true}, {1, 2, 2, 70, 128, false}, {2, 12, 12, 256, 64, false}}},
  };
  for (const Precision& precision : precisions) {
    for (const CudaAttentionCase& c : precision.cases) {
      SCOPED_TRACE(std::string(precision.autocast ? dtype_name(*precision.autocast) : "float32") + " B " +
                   std::to_string(c.B) + " H " + std::to_string(c.H) + " Hkv " + std::to_string(c.Hkv) + " T " +
                   std::to_string(c.T) + " d " + std::to_string(c.d) + (c.padded ? " padded" : ""));
      const Tensor q0 = randn({c.B, c.T, c.H, c.d}), k0 = randn({c.B, c.T, c.Hkv, c.d}),
                   v0 = randn({c.B, c.T, c.Hkv, c.d}), dy = randn({c.B, c.H, c.T, c.d});
      const std::vector<double> keep = c.padded ? padding_pattern(c.B, c.T) : std::vector<double>{};
      const Tensor keep_gpu =
          c.padded ? Tensor::from_vector(keep, {c.B, c.T}, TensorOptions(DType::Float32).with_device(gpu)) : Tensor();

      Tensor qr = q0.to(DType::Float64).set_requires_grad(true), kr = k0.to(DType::Float64).set_requires_grad(true),
             vr = v0.to(DType::Float64).set_requires_grad(true);
      Tensor reference = reference_attention(heads(qr), heads(kr), heads(vr), keep);
      reference.backward(dy.to(DType::Float64));

      Tensor qg = q0.to(gpu).set_requires_grad(true), kg = k0.to(gpu).set_requires_grad(true),
             vg = v0.to(gpu).set_requires_grad(true);
      Tensor out;
      {
        amp::AutocastGuard autocast(DeviceKind::CUDA, precision.autocast, precision.autocast.has_value());
        ASSERT_TRUE(fused_causal_attention_applies(heads(qg), heads(kg), heads(vg), c.padded));
        out = fused_causal_attention(heads(qg), heads(kg), heads(vg), keep_gpu);
        out.backward(dy.to(gpu));
      }
      EXPECT_EQ(out.dtype(), DType::Float32);
      EXPECT_TRUE(out.permute({0, 2, 1, 3}).is_contiguous());  // (B, T, H, d) memory
      EXPECT_LT(relative_error(out, reference), precision.tolerance);
      EXPECT_LT(relative_error(qg.grad(), qr.grad()), 10 * precision.tolerance);
      EXPECT_LT(relative_error(kg.grad(), kr.grad()), 10 * precision.tolerance);
      EXPECT_LT(relative_error(vg.grad(), vr.grad()), 10 * precision.tolerance);

      Tensor qa = leaf(qg), ka = leaf(kg), va = leaf(vg);
      {
        amp::AutocastGuard autocast(DeviceKind::CUDA, precision.autocast, precision.autocast.has_value());
        fused_causal_attention(heads(qa), heads(ka), heads(va), keep_gpu).backward(dy.to(gpu));
      }
      EXPECT_EQ(max_abs_diff(qa.grad().to(Device::cpu(0)), qg.grad().to(Device::cpu(0))), 0.0);
      EXPECT_EQ(max_abs_diff(ka.grad().to(Device::cpu(0)), kg.grad().to(Device::cpu(0))), 0.0);
      EXPECT_EQ(max_abs_diff(va.grad().to(Device::cpu(0)), vg.grad().to(Device::cpu(0))), 0.0);
    }
  }
}

// What the CPU devices' fused kernels do not take, and the errors that name it.
TEST(FusedCausalAttentionTest, CpuTakesNeitherGroupsNorPadding) {
  const Tensor q = randn({2, 4, 5, 8}), kv = randn({2, 2, 5, 8});
  EXPECT_TRUE(fused_causal_attention_applies(q, q, q));
  EXPECT_FALSE(fused_causal_attention_applies(q, q, q, /*key_padding=*/true));
  EXPECT_FALSE(fused_causal_attention_applies(q, kv, kv));
  std::string e = error_of([&] { fused_causal_attention(q, kv, kv); });
  EXPECT_NE(e.find("fused_causal_attention: no fused kernel for query [2, 4, 5, 8] float32 on cpu:0, key [2, 2, 5, "
                   "8] float32 on cpu:0, value [2, 2, 5, 8] float32 on cpu:0 (CPU devices: float32, key and value "
                   "shaped as the query, no padding mask"),
            std::string::npos)
      << e;
  e = error_of([&] { fused_causal_attention(q, q, q, ones({2, 5})); });
  EXPECT_NE(e.find("on cpu:0 with a key padding mask (CPU devices"), std::string::npos) << e;
  // Where it applies, the same values as scaled_dot_product_attention's is_causal.
  EXPECT_EQ(max_abs_diff(fused_causal_attention(q, q, q, {}, 0.5),
                         scaled_dot_product_attention(q, q, q, {}, true, 0.5)),
            0.0);
}

}  // namespace
}  // namespace dpe
