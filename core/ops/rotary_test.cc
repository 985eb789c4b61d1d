// apply_rotary_emb: float64 gradchecks (the fused CPU op on a permuted view and on a contiguous tensor; the
// composition when cos and sin require grad), the fused op against the composition it replaces (the same
// numbers, forward and backward, float32), input errors, CUDA against both.
#include "core/ops/rotary.h"

#include <gtest/gtest.h>

#include "core/autograd/grad_mode.h"
#include "core/ops.h"
#include "tests/testing/errors.h"
#include "tests/testing/gradcheck.h"

namespace dpe {
namespace {

using dpe::testing::error_of;

// x * cos + rotate_half(x) * sin from tensor ops: what apply_rotary_emb composes on other devices.
Tensor composed(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  return x * cos + cat({neg(x.narrow(-1, half, half)), x.narrow(-1, 0, half)}, -1) * sin;
}

// attention's heads: (B, T, H, d) -> (B, H, T, d), a permuted view
Tensor heads(const Tensor& x) { return x.permute({0, 2, 1, 3}); }

TEST(RotaryEmbTest, GradcheckOnAPermutedViewAndContiguous) {
  const Tensor cos = randn({5, 6}), sin = randn({5, 6});
  const Tensor c64 = cos.to(DType::Float64), s64 = sin.to(DType::Float64);
  Tensor x = testing::randn_leaf({2, 5, 3, 6}, 1);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return apply_rotary_emb(heads(in[0]), c64, s64); },
                               {x}),
            "");
  Tensor x2 = testing::randn_leaf({5, 6}, 2);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return apply_rotary_emb(in[0], c64, s64); }, {x2}),
            "");
}

TEST(RotaryEmbTest, GradcheckInTheTables) {
  Tensor x = testing::randn_leaf({2, 4, 4}, 3);
  Tensor cos = testing::randn_leaf({4, 4}, 4), sin = testing::randn_leaf({4, 4}, 5);
  EXPECT_EQ(testing::gradcheck([](const std::vector<Tensor>& in) { return apply_rotary_emb(in[0], in[1], in[2]); },
                               {x, cos, sin}),
            "");
}

// The same numbers as the composition: every product rounded once, then added (float32, where a fused
// multiply-add would show). A permuted x of 70 positions straddles the kernel's 64-row blocks.
TEST(RotaryEmbTest, FusedMatchesTheComposition) {
  const Tensor cos = randn({70, 32}), sin = randn({70, 32});
  const Tensor base = randn({3, 70, 4, 32}), dy = randn({3, 4, 70, 32});
  Tensor a = base.detach().clone().set_requires_grad(true), b = base.detach().clone().set_requires_grad(true);
  Tensor fused = apply_rotary_emb(heads(a), cos, sin), reference = composed(heads(b), cos, sin);
  EXPECT_EQ(fused.shape(), (Shape{3, 4, 70, 32}));
  EXPECT_TRUE(fused.is_contiguous());
  EXPECT_EQ(max_abs_diff(fused, reference), 0.0);
  fused.backward(dy);
  reference.backward(dy);
  EXPECT_EQ(max_abs_diff(a.grad(), b.grad()), 0.0);
}

// No elements: an empty result of x's shape (no head elements, or no positions).
TEST(RotaryEmbTest, EmptyInputs) {
  EXPECT_EQ(apply_rotary_emb(zeros({3, 0}), zeros({3, 0}), zeros({3, 0})).shape(), (Shape{3, 0}));
  Tensor x = zeros({2, 0, 4}).set_requires_grad(true);
  Tensor y = apply_rotary_emb(x, zeros({0, 4}), zeros({0, 4}));
  EXPECT_EQ(y.shape(), (Shape{2, 0, 4}));
  sum(y).backward();
  EXPECT_EQ(x.grad().shape(), (Shape{2, 0, 4}));
}

TEST(RotaryEmbTest, NoGraphWithoutGrad) {
  Tensor x = randn({2, 4}).set_requires_grad(true);
  NoGradGuard no_grad;
  EXPECT_FALSE(apply_rotary_emb(x, randn({2, 4}), randn({2, 4})).requires_grad());
}

TEST(RotaryEmbTest, ErrorsNameTheShapes) {
  EXPECT_NE(error_of([] { apply_rotary_emb(zeros({4}), zeros({4}), zeros({4})); })
                .find("apply_rotary_emb: expected x of shape (..., T, head_dim), got [4]"),
            std::string::npos);
  EXPECT_NE(error_of([] { apply_rotary_emb(zeros({2, 3}), zeros({2, 3}), zeros({2, 3})); })
                .find("head_dim must be even, got x [2, 3]"),
            std::string::npos);
  EXPECT_NE(error_of([] { apply_rotary_emb(zeros({5, 2, 4}), zeros({5, 4}), zeros({2, 4})); })
                .find("x [5, 2, 4] needs cos and sin of shape [2, 4], got [5, 4] and [2, 4]"),
            std::string::npos);
  EXPECT_NE(error_of([] { apply_rotary_emb(zeros({2, 4}), Tensor(), zeros({2, 4})); }).find("got undefined and [2, 4]"),
            std::string::npos);
  EXPECT_NE(error_of([] { apply_rotary_emb(zeros({2, 4}), zeros({2, 4}, DType::Float64), zeros({2, 4})); })
                .find("dtypes differ (float32 and float64)"),
            std::string::npos);
  EXPECT_NE(error_of([] { apply_rotary_emb(zeros({2, 4}, DType::Int64), zeros({2, 4}), zeros({2, 4})); })
                .find("expected a float32 or float64 tensor, got int64"),
            std::string::npos);
}

// The CUDA kernel rounds the same products and sums as the CPU kernel and the composition (on CUDA too): the
// same numbers all three ways, forward and backward.
TEST(RotaryEmbTest, CudaMatchesCpuAndTheComposition) {
  if (!dpe::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const Tensor cos = randn({70, 32}), sin = randn({70, 32});
  const Tensor base = randn({3, 70, 4, 32}), dy = randn({3, 4, 70, 32});
  Tensor a = base.detach().clone().set_requires_grad(true), b = base.detach().to(gpu).set_requires_grad(true);
  Tensor c = base.detach().to(gpu).set_requires_grad(true);
  Tensor cpu = apply_rotary_emb(heads(a), cos, sin), cuda = apply_rotary_emb(heads(b), cos.to(gpu), sin.to(gpu));
  Tensor reference = composed(heads(c), cos.to(gpu), sin.to(gpu));
  EXPECT_EQ(max_abs_diff(cuda.to(Device::cpu(0)), cpu), 0.0);
  EXPECT_EQ(max_abs_diff(cuda, reference), 0.0);
  cpu.backward(dy);
  cuda.backward(dy.to(gpu));
  reference.backward(dy.to(gpu));
  EXPECT_EQ(max_abs_diff(b.grad().to(Device::cpu(0)), a.grad()), 0.0);
  EXPECT_EQ(max_abs_diff(b.grad(), c.grad()), 0.0);
  // More elements than the kernel's grid has threads (65,536 blocks of 256): its grid-stride loop.
  const Tensor big = randn({1, 4100, 64, 64}), big_cos = randn({4100, 64}), big_sin = randn({4100, 64});
  EXPECT_EQ(max_abs_diff(apply_rotary_emb(heads(big.to(gpu)), big_cos.to(gpu), big_sin.to(gpu)).to(Device::cpu(0)),
                         apply_rotary_emb(heads(big), big_cos, big_sin)),
            0.0);
}

}  // namespace
}  // namespace dpe
