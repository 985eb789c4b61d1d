// batch_norm / layer_norm / rms_norm ops: gradchecks, running-stat updates, errors, CUDA parity.
// (Module-level and PyTorch golden tests: layers/batchnorm_test.cc, layers/normalization_test.cc.)
#include "core/ops/norm.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/ops.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/errors.h"

namespace dpe {
namespace {

using dpe::testing::error_of;

Tensor f64(const std::vector<double>& v, const Shape& s) { return Tensor::from_vector(v, s); }

TEST(NormOpsTest, BatchNormGradcheckTraining) {
  Tensor w = testing::randn_leaf({3}, 1), b = testing::randn_leaf({3}, 2);
  for (Shape shape : {Shape{4, 3}, Shape{2, 3, 5}, Shape{2, 3, 2, 3}}) {
    SCOPED_TRACE(shape_str(shape));
    Tensor x = testing::randn_leaf(shape, 3);
    Tensor rm = zeros({3}, DType::Float64), rv = ones({3}, DType::Float64);
    EXPECT_EQ(testing::gradcheck(
                  [&](const std::vector<Tensor>& in) { return batch_norm(in[0], rm, rv, in[1], in[2], true, 0.1, 1e-5); },
                  {x, w, b}),
              "");
    // Without running stats, and without affine parameters.
    EXPECT_EQ(testing::gradcheck(
                  [&](const std::vector<Tensor>& in) {
                    return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5);
                  },
                  {x}),
              "");
  }
}

TEST(NormOpsTest, BatchNormGradcheckEval) {
  Tensor w = testing::randn_leaf({2}, 4), b = testing::randn_leaf({2}, 5);
  Tensor rm = f64({0.5, -1}, {2}), rv = f64({2, 0.3}, {2});
  for (Shape shape : {Shape{3, 2}, Shape{2, 2, 3, 2}}) {
    Tensor x = testing::randn_leaf(shape, 6);
    EXPECT_EQ(testing::gradcheck(
                  [&](const std::vector<Tensor>& in) { return batch_norm(in[0], rm, rv, in[1], in[2], false, 0.1, 1e-5); },
                  {x, w, b}),
              "");
  }
}

TEST(NormOpsTest, BatchNormUpdatesRunningStatsInPlace) {
  // Channel 0 over (N, L): {1, 3, 5, 7} -> mean 4, unbiased var 20/3; channel 1: {0, 0, 2, 2} -> 1, 4/3.
  Tensor x = f64({1, 3, 0, 0, 5, 7, 2, 2}, {2, 2, 2});
  Tensor rm = f64({1, 1}, {2}), rv = f64({1, 1}, {2});
  Tensor rm_handle = rm;  // the update is in place: every handle sees it
  batch_norm(x, rm, rv, Tensor(), Tensor(), true, 0.5, 1e-5);
  std::vector<double> m = rm_handle.to_vector<double>(), v = rv.to_vector<double>();
  EXPECT_NEAR(m[0], 0.5 * 1 + 0.5 * 4, 1e-12);
  EXPECT_NEAR(m[1], 0.5 * 1 + 0.5 * 1, 1e-12);
  EXPECT_NEAR(v[0], 0.5 * 1 + 0.5 * 20.0 / 3.0, 1e-12);
  EXPECT_NEAR(v[1], 0.5 * 1 + 0.5 * 4.0 / 3.0, 1e-12);
  // Eval leaves them alone.
  batch_norm(x, rm, rv, Tensor(), Tensor(), false, 0.5, 1e-5);
  EXPECT_EQ(rm.to_vector<double>(), m);
}

// The running statistics are updated by the statistics pass (contiguous buffers) or by tensor ops (strided
// ones): the same roundings, so the same bits; float32 so that a different rounding would show.
TEST(NormOpsTest, BatchNormRunningStatsInStridedBuffersMatchContiguousOnes) {
  Tensor x = Tensor::from_vector(std::vector<float>{0.1f, 3.7f, -2.2f, 0.9f, 5.3f, 7.1f, 2.6f, -1.4f, 0.3f, 2.2f, 4.4f,
                                                    -0.6f},
                                 {3, 2, 2});
  const std::vector<float> initial_mean{0.3f, -0.7f}, initial_var{1.3f, 0.6f};
  Tensor rm = Tensor::from_vector(initial_mean, {2}), rv = Tensor::from_vector(initial_var, {2});
  Tensor holder = zeros({2, 2, 2}, TensorOptions(DType::Float32));
  Tensor srm = holder.select(-1, 0).select(-1, 0), srv = holder.select(-1, 1).select(-1, 1);
  srm.copy_(rm);
  srv.copy_(rv);
  ASSERT_FALSE(srm.is_contiguous());
  for (int step = 0; step < 3; ++step) {
    Tensor y = batch_norm(x, rm, rv, Tensor(), Tensor(), true, 0.1, 1e-5);
    Tensor strided_y = batch_norm(x, srm, srv, Tensor(), Tensor(), true, 0.1, 1e-5);
    EXPECT_EQ(y.to_vector<float>(), strided_y.to_vector<float>());
    EXPECT_EQ(rm.to_vector<float>(), srm.contiguous().to_vector<float>()) << "step " << step;
    EXPECT_EQ(rv.to_vector<float>(), srv.contiguous().to_vector<float>()) << "step " << step;
  }
  EXPECT_NE(rm.to_vector<float>(), initial_mean);
  EXPECT_NE(rv.to_vector<float>(), initial_var);
}

// nn::BatchNorm's counter: one per training call (in the statistics pass, or by ops without channels), none
// in eval and none when the call fails its checks.
TEST(NormOpsTest, BatchNormCountsTrainingBatches) {
  Tensor x = Tensor::from_vector(std::vector<double>{1, 3, 0, 0, 5, 7, 2, 2}, {2, 2, 2});
  Tensor counter = zeros({}, TensorOptions(DType::Int64));
  batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, counter);
  batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, counter);
  EXPECT_EQ(counter.item(), 2.0);
  batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false, 0.1, 1e-5, counter);
  EXPECT_EQ(counter.item(), 2.0);
  EXPECT_THROW(batch_norm(zeros({1, 2}), Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, counter), Error);
  EXPECT_EQ(counter.item(), 2.0);
  batch_norm(zeros({2, 0, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, counter);
  EXPECT_EQ(counter.item(), 3.0);
  EXPECT_NE(error_of([&] {
              batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, zeros({}));
            }).find("num_batches_tracked must be one int64 value, got float32"),
            std::string::npos);
}

TEST(NormOpsTest, BatchNormErrors) {
  Tensor x = zeros({4, 3});
  EXPECT_NE(error_of([&] { batch_norm(zeros({4}), Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5); })
                .find("at least 2 dims"),
            std::string::npos);
  EXPECT_NE(error_of([&] { batch_norm(x, zeros({2}), ones({2}), Tensor(), Tensor(), true, 0.1, 1e-5); })
                .find("running_mean has shape [2], expected [3]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { batch_norm(x, zeros({3}), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5); })
                .find("both be given"),
            std::string::npos);
  EXPECT_NE(error_of([&] { batch_norm(x, Tensor(), Tensor(), ones({3}, DType::Float64), Tensor(), true, 0.1, 1e-5); })
                .find("weight is float64 but the input is float32"),
            std::string::npos);
  EXPECT_NE(error_of([&] { batch_norm(zeros({1, 3, 1}), Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5); })
                .find("expected more than 1 value per channel when training"),
            std::string::npos);
}

TEST(NormOpsTest, LayerNormGradcheck) {
  Tensor x = testing::randn_leaf({2, 3, 4}, 7);
  Tensor w = testing::randn_leaf({4}, 8), b = testing::randn_leaf({4}, 9);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return layer_norm(in[0], {4}, in[1], in[2], 1e-5); },
                               {x, w, b}),
            "");
  Tensor w2 = testing::randn_leaf({3, 4}, 10);
  EXPECT_EQ(
      testing::gradcheck([&](const std::vector<Tensor>& in) { return layer_norm(in[0], {3, 4}, in[1], Tensor(), 1e-5); },
                         {x, w2}),
      "");
  // A non-contiguous input goes through reshape's copy.
  Tensor xt = testing::randn_leaf({4, 3}, 11);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return layer_norm(in[0].t(), {4}, Tensor(), Tensor(), 1e-5); },
                               {xt}),
            "");
}

TEST(NormOpsTest, RmsNormGradcheckAndErrors) {
  Tensor x = testing::randn_leaf({3, 5}, 12), w = testing::randn_leaf({5}, 13);
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1], 1e-6); }, {x, w}), "");
  EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return rms_norm(in[0], Tensor(), 1e-6); }, {x}), "");
  EXPECT_NE(error_of([&] { rms_norm(zeros({2, 5}), zeros({4}), 1e-6); }).find("weight has shape [4], expected [5]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { layer_norm(zeros({2, 5}), {4}, Tensor(), Tensor(), 1e-5); })
                .find("input [2, 5] does not end with normalized_shape [4]"),
            std::string::npos);
}

TEST(NormOpsTest, CudaMatchesCpu) {
  if (!dpe::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  Tensor x = randn({4, 3, 5, 5}) * 2.0 + 0.5;
  Tensor w = randn({3}), b = randn({3});
  Tensor rm = zeros({3}), rv = ones({3});
  Tensor rm_g = rm.to(gpu), rv_g = rv.to(gpu);
  Tensor y = batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5);
  Tensor y_g = batch_norm(x.to(gpu), rm_g, rv_g, w.to(gpu), b.to(gpu), true, 0.1, 1e-5);
  // float32 with different summation orders on the two backends: a few ulps of the channel sums.
  EXPECT_LT(max_abs_diff(y_g.to(Device::cpu(0)), y), 1e-4);
  EXPECT_LT(max_abs_diff(rm_g.to(Device::cpu(0)), rm), 1e-5);
  EXPECT_LT(max_abs_diff(rv_g.to(Device::cpu(0)), rv), 1e-5);
  Tensor h = randn({6, 32});
  EXPECT_LT(max_abs_diff(layer_norm(h.to(gpu), {32}, Tensor(), Tensor(), 1e-5).to(Device::cpu(0)),
                         layer_norm(h, {32}, Tensor(), Tensor(), 1e-5)),
            1e-5);
  EXPECT_LT(max_abs_diff(rms_norm(h.to(gpu), Tensor(), 1e-6).to(Device::cpu(0)), rms_norm(h, Tensor(), 1e-6)), 1e-5);
}

// rms_norm is one kernel forward and two backward on CUDA (kernels/rms_norm.h): the CPU kernel's numbers up to
// the order of the row sums (float32: a few ulps), with and without a weight; 150 rows cross the dweight
// kernel's blocks of 64 rows, a width of 300 a block of 256 threads, and 70,000 rows the 65,536 blocks of the
// row kernels (dweight's sum over them gets a wider tolerance below).
TEST(NormOpsTest, RmsNormOnCudaMatchesCpuForwardAndBackward) {
  if (!dpe::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0), cpu = Device::cpu(0);
  for (const Shape& shape : {Shape{150, 300}, Shape{2, 3, 32}, Shape{1, 1}, Shape{70000, 8}}) {
    for (bool weighted : {true, false}) {
      const Tensor x = randn(shape) * 3.0 + 0.25, dy = randn(shape);
      const Tensor w = randn({shape.back()});
      Tensor xc = x.detach().set_requires_grad(true), xg = x.to(gpu).set_requires_grad(true);
      Tensor wc = weighted ? w.detach().set_requires_grad(true) : Tensor();
      Tensor wg = weighted ? w.to(gpu).set_requires_grad(true) : Tensor();
      Tensor yc = rms_norm(xc, wc, 1e-6), yg = rms_norm(xg, wg, 1e-6);
      EXPECT_LT(max_abs_diff(yg.to(cpu), yc), 1e-5) << shape_str(shape) << " weight " << weighted;
      yc.backward(dy);
      yg.backward(dy.to(gpu));
      EXPECT_LT(max_abs_diff(xg.grad().to(cpu), xc.grad()), 1e-5) << shape_str(shape) << " weight " << weighted;
      if (weighted) {  // a float32 sum over every row, in blocks of 64: its rounding grows with the rows
        EXPECT_LT(max_abs_diff(wg.grad().to(cpu), wc.grad()), 1e-4 * std::max<int64_t>(1, shape[0] / 1000))
            << shape_str(shape);
      }
    }
  }
}

}  // namespace
}  // namespace dpe
