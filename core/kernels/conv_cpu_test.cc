// conv_cpu.cc's primitive cache: a primitive is kept per thread share (Note [oneDNN primitive cache]), so a
// caller with more cores than the thread that built a shape's primitive gets one built for its own share.
// (The convolutions' values are tested against float64 in core/ops/conv_test.cc and against CUDA in
// kernels_parity_test.)
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <thread>
#include <vector>

#include "core/kernels/conv.h"
#include "core/kernels/onednn.h"

namespace dpe::kernels {
namespace {

// On a thread of its own with `threads` OpenMP threads, as a device worker with that share runs it.
std::vector<float> forward_with_threads(int threads, const Conv2dShape& s, const std::vector<float>& x,
                                        const std::vector<float>& w) {
  std::vector<float> y(static_cast<size_t>(s.n * s.c_out * s.h_out() * s.w_out()));
  std::thread worker([&] {
    omp_set_num_threads(threads);
    conv2d_forward_cpu(s, x.data(), w.data(), nullptr, y.data());
  });
  worker.join();
  return y;
}

TEST(ConvCpu, PrimitivesAreKeptPerThreadShare) {
  // A shape no other test of this binary builds.
  Conv2dShape s{.n = 3, .c_in = 5, .h = 11, .w = 13, .c_out = 7, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1};
  std::vector<float> x(static_cast<size_t>(s.n * s.c_in * s.h * s.w)), w(static_cast<size_t>(s.c_out * s.c_in * 9));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.11f * static_cast<float>(i));

  const size_t before = detail::onednn_conv_primitives_cached();
  const std::vector<float> one = forward_with_threads(1, s, x, w);
  ASSERT_EQ(detail::onednn_conv_primitives_cached(), before + 1);
  forward_with_threads(1, s, x, w);
  EXPECT_EQ(detail::onednn_conv_primitives_cached(), before + 1) << "the same share built the shape again";
  const std::vector<float> two = forward_with_threads(2, s, x, w);
  EXPECT_EQ(detail::onednn_conv_primitives_cached(), before + 2)
      << "a caller with 2 threads ran the primitive built for 1 (oneDNN keeps the work split it was built with)";
  forward_with_threads(2, s, x, w);
  EXPECT_EQ(detail::onednn_conv_primitives_cached(), before + 2);
  // Either primitive computes the same convolution (the sums may split differently).
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(one[i], two[i], 1e-4f * (1.0f + std::fabs(one[i]))) << i;
}

}  // namespace
}  // namespace dpe::kernels
