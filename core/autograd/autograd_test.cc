#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"

namespace dpe {
namespace {

TEST(AutogradTest, LeafGradientsAccumulate) {
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}).set_requires_grad(true);
  sum(w * w).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 4, 6}));
  sum(w * 3.0).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{5, 7, 9}));  // += across backward calls
  w.set_grad({});
  EXPECT_FALSE(w.grad().defined());
}

// The first gradient becomes the leaf's own: the backward's tensor itself when nothing else can reach it,
// else a copy. Never an alias of the caller's tensor, nor a view that keeps a larger storage alive.
TEST(AutogradTest, FirstGradientIsOwnedByTheLeaf) {
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}).set_requires_grad(true);
  Tensor given = Tensor::from_vector(std::vector<float>{4, 5, 6}, {3});
  w.backward(given);  // the incoming gradient is the caller's tensor: copied
  EXPECT_NE(w.grad().storage(), given.storage());
  given.fill_(0.0);
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{4, 5, 6}));

  Tensor a = Tensor::from_vector(std::vector<float>{1, 2}, {2}).set_requires_grad(true);
  Tensor b = Tensor::from_vector(std::vector<float>{3, 4, 5}, {3}).set_requires_grad(true);
  sum(cat({a, b}) * 2.0).backward();  // a's and b's gradients arrive as views of one (5) gradient
  for (const Tensor* leaf : {&a, &b}) {
    EXPECT_TRUE(leaf->grad().is_contiguous());
    EXPECT_EQ(leaf->grad().storage()->nbytes(), leaf->grad().nbytes());
    EXPECT_EQ(leaf->grad().storage_offset(), 0);
  }
  EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{2, 2, 2}));
}

TEST(AutogradTest, SharedSubexpressionsSumTheirGradients) {
  Tensor x = Tensor::from_vector(std::vector<double>{2}, {1}).set_requires_grad(true);
  Tensor y = x * x;      // 2x
  Tensor z = y * y + y;  // d/dx (x^4 + x^2) = 4x^3 + 2x
  sum(z).backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 4 * 8 + 2 * 2);
}

TEST(AutogradTest, NoGradBuildsNoGraph) {
  Tensor w = ones({2}).set_requires_grad(true);
  {
    NoGradGuard no_grad;
    Tensor y = w * 2.0;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
  }
  EXPECT_TRUE((w * 2.0).requires_grad());
  EXPECT_TRUE(GradMode::is_enabled());
}

TEST(AutogradTest, GradModeIsPerThread) {
  NoGradGuard no_grad;
  bool other_thread_enabled = false;
  std::thread([&] { other_thread_enabled = GradMode::is_enabled(); }).join();
  EXPECT_TRUE(other_thread_enabled);
}

TEST(AutogradTest, ClearErrors) {
  Tensor c = ones({2});
  EXPECT_THROW(sum(c).backward(), Error);  // nothing requires grad
  Tensor w = ones({2}).set_requires_grad(true);
  Tensor y = w * 2.0;
  EXPECT_THROW(y.backward(), Error);  // non-scalar root without gradient
  EXPECT_THROW(y.set_requires_grad(false), Error);  // not a leaf
  EXPECT_THROW(zeros({2}, DType::Int64).set_requires_grad(true), Error);
  Tensor loss = sum(exp(w));
  loss.backward();
  try {
    loss.backward();
    ADD_FAILURE() << "second backward through a freed graph";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a second time"), std::string::npos) << e.what();
  }
}

TEST(AutogradTest, PostAccumulateHookRunsInReverseOrder) {
  Tensor w1 = ones({3, 3}).set_requires_grad(true);
  Tensor w2 = ones({3, 3}).set_requires_grad(true);
  std::vector<int> order;
  w1.register_post_accumulate_grad_hook([&](const Tensor& t) {
    EXPECT_TRUE(t.grad().defined());
    order.push_back(1);
  });
  int64_t h2 = w2.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back(2); });
  Tensor x = ones({1, 3});
  sum(matmul(relu(matmul(x, w1)), w2)).backward();
  EXPECT_EQ(order, (std::vector<int>{2, 1}));  // w2 is used last, so its gradient is ready first
  w2.remove_post_accumulate_grad_hook(h2);
  sum(matmul(relu(matmul(x, w1)), w2)).backward();
  EXPECT_EQ(order, (std::vector<int>{2, 1, 1}));
  EXPECT_THROW(ones({2}).register_post_accumulate_grad_hook([](const Tensor&) {}), Error);
}

TEST(AutogradTest, ConcurrentBackwardOnSeparateGraphsIntoOneLeaf) {
  // Worker threads running backward at once (DP replicas) must not race on a shared leaf's .grad.
  Tensor w = Tensor::from_vector(std::vector<double>(64, 1.0), {8, 8}).set_requires_grad(true);
  constexpr int kThreads = 4, kSteps = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      Tensor x = ones({2, 8}, DType::Float64);
      for (int s = 0; s < kSteps; ++s) sum(matmul(x, w)).backward();
    });
  }
  for (auto& t : threads) t.join();
  // d/dw sum(ones(2,8) @ w) = 2 everywhere, per step.
  for (double g : w.grad().to_vector<double>()) EXPECT_EQ(g, 2.0 * kThreads * kSteps);
}

TEST(AutogradTest, DetachCutsTheGraph) {
  Tensor w = ones({2}).set_requires_grad(true);
  Tensor d = (w * 2.0).detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
}

}  // namespace
}  // namespace dpe
