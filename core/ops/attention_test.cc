// scaled_dot_product_attention: the fused causal CPU kernels against the composition they replace (float32,
// forward and backward, on attention's permuted views of heads and on contiguous tensors), the output's layout,
// float64 gradchecks of the composition (causal and with a mask), when the fused kernels apply, NaN, input
// errors, CUDA parity.
#include "core/ops/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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

// CUDA composes the op from tensor ops; the CPU's fused kernels round the same products and sums.
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

}  // namespace
}  // namespace dpe
