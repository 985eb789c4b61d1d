// conv2d_relu_max_pool2d_cpu and its backward against references written here from conv_pool.h's contract: the
// forward bit for bit (each output's products fused into a running sum from 0 in (ci, kh, kw) order, + b, then
// max_pool2d's rule and relu) with its window codes, in NCHW and channels last; the weight and bias gradients
// against double sums over the windows' winners. Shapes with one and three input channels, output channels that
// do not fill the last vector, odd convolution outputs (the pool's floor), and kernels other than 3x3; the same
// bits on one and two threads.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/kernels/conv_pool.h"
#include "core/kernels/pool.h"
#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {
namespace {

uint32_t bits_of(float v) { return std::bit_cast<uint32_t>(v); }

struct Case {
  std::string name;
  int64_t n, c_in, h, w, c_out, kh, kw, pad_h, pad_w;
};

std::vector<Case> cases() {
  return {
      {"the CNN's first convolution", 3, 1, 28, 28, 32, 3, 3, 1, 1},
      {"three input channels, 13 output channels", 2, 3, 9, 11, 13, 3, 3, 1, 1},
      {"odd convolution output, no padding", 2, 1, 8, 9, 8, 2, 3, 0, 0},
      {"5x5 kernel, one output channel", 1, 1, 12, 10, 1, 5, 5, 2, 2},
      {"24 output channels, uneven padding", 2, 2, 7, 6, 24, 3, 3, 1, 0},
  };
}

Conv2dShape shape_of(const Case& c, bool channels_last) {
  Conv2dShape s;
  s.n = c.n;
  s.c_in = c.c_in;
  s.h = c.h;
  s.w = c.w;
  s.c_out = c.c_out;
  s.kh = c.kh;
  s.kw = c.kw;
  s.pad_h = c.pad_h;
  s.pad_w = c.pad_w;
  s.channels_last = channels_last;
  return s;
}

// Offsets of (n, c, i, j) in a tensor of (N, C, H, W) in either format.
int64_t at(bool channels_last, int64_t C, int64_t H, int64_t W, int64_t n, int64_t c, int64_t i, int64_t j) {
  return channels_last ? ((n * H + i) * W + j) * C + c : ((n * C + c) * H + i) * W + j;
}

struct Data {
  Conv2dShape s;
  std::vector<float> x, w, b;
};

Data make_data(const Case& c, bool channels_last, uint32_t seed) {
  Data d{shape_of(c, channels_last), {}, {}, {}};
  d.x = random_vector<float>(c.n * c.c_in * c.h * c.w, -1.0, 1.0, seed);
  d.w = random_vector<float>(c.c_out * c.c_in * c.kh * c.kw, -0.5, 0.5, seed + 1);
  d.b = random_vector<float>(c.c_out, -0.2, 0.2, seed + 2);
  return d;
}

// The convolution output (n, co, r, q) as the contract orders it.
float conv_at(const Data& d, int64_t n, int64_t co, int64_t r, int64_t q) {
  const Conv2dShape& s = d.s;
  float sum = 0.0f;
  for (int64_t ci = 0; ci < s.c_in; ++ci) {
    for (int64_t i = 0; i < s.kh; ++i) {
      for (int64_t j = 0; j < s.kw; ++j) {
        const int64_t row = r + i - s.pad_h, col = q + j - s.pad_w;
        const float v = row < 0 || row >= s.h || col < 0 || col >= s.w
                            ? 0.0f
                            : d.x[at(s.channels_last, s.c_in, s.h, s.w, n, ci, row, col)];
        sum = std::fma(v, d.w[((co * s.c_in + ci) * s.kh + i) * s.kw + j], sum);
      }
    }
  }
  return sum + d.b[co];
}

struct Pooled {
  std::vector<float> y;       // y's format
  std::vector<uint8_t> codes; // (N, H_p, W_p, C_out)
};

Pooled reference_forward(const Data& d) {
  const Conv2dShape& s = d.s;
  const int64_t hp = conv_pool_h(s), wp = conv_pool_w(s);
  Pooled p{std::vector<float>(s.n * s.c_out * hp * wp), std::vector<uint8_t>(s.n * hp * wp * s.c_out)};
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t co = 0; co < s.c_out; ++co) {
      for (int64_t oh = 0; oh < hp; ++oh) {
        for (int64_t ow = 0; ow < wp; ++ow) {
          float best = conv_at(d, n, co, 2 * oh, 2 * ow);
          uint8_t code = 0;
          for (uint8_t place = 1; place < 4; ++place) {
            const float v = conv_at(d, n, co, 2 * oh + place / 2, 2 * ow + place % 2);
            if (v > best || (std::isnan(v) && !std::isnan(best))) {
              best = v;
              code = place;
            }
          }
          if (best <= 0.0f) {
            best = 0.0f;
            code = kNoWinner;
          }
          p.y[at(s.channels_last, s.c_out, hp, wp, n, co, oh, ow)] = best;
          p.codes[((n * hp + oh) * wp + ow) * s.c_out + co] = code;
        }
      }
    }
  }
  return p;
}

Pooled run_forward(const Data& d) {
  const int64_t hp = conv_pool_h(d.s), wp = conv_pool_w(d.s);
  Pooled p{std::vector<float>(d.s.n * d.s.c_out * hp * wp, -7.0f),
           std::vector<uint8_t>(d.s.n * hp * wp * d.s.c_out, 99)};
  conv2d_relu_max_pool2d_cpu(d.s, d.x.data(), d.w.data(), d.b.data(), p.y.data(), p.codes.data());
  return p;
}

TEST(ConvPoolCpuTest, ForwardIsTheContractsSumsPooledBitForBit) {
  uint32_t seed = 10;
  for (const Case& c : cases()) {
    for (bool channels_last : {false, true}) {
      SCOPED_TRACE(c.name + (channels_last ? ", channels last" : ", NCHW"));
      const Data d = make_data(c, channels_last, seed += 3);
      ASSERT_TRUE(conv2d_relu_max_pool2d_applies(d.s));
      const Pooled want = reference_forward(d), got = run_forward(d);
      ASSERT_EQ(got.y.size(), want.y.size());
      for (size_t k = 0; k < want.y.size(); ++k) ASSERT_EQ(bits_of(got.y[k]), bits_of(want.y[k])) << "y[" << k << "]";
      for (size_t k = 0; k < want.codes.size(); ++k) ASSERT_EQ(got.codes[k], want.codes[k]) << "codes[" << k << "]";
    }
  }
}

TEST(ConvPoolCpuTest, NanWinsItsWindowAndPropagates) {
  const Case c{"nan", 1, 1, 6, 6, 8, 3, 3, 1, 1};
  Data d = make_data(c, false, 5);
  d.x[2 * 6 + 3] = std::numeric_limits<float>::quiet_NaN();  // under several windows of every channel
  const Pooled want = reference_forward(d), got = run_forward(d);
  int nans = 0;
  for (size_t k = 0; k < want.y.size(); ++k) {
    ASSERT_EQ(std::isnan(got.y[k]), std::isnan(want.y[k])) << k;
    nans += std::isnan(got.y[k]) ? 1 : 0;
    if (!std::isnan(want.y[k])) {
      ASSERT_EQ(bits_of(got.y[k]), bits_of(want.y[k])) << k;
    }
  }
  EXPECT_GT(nans, 0);
  for (size_t k = 0; k < want.codes.size(); ++k) ASSERT_EQ(got.codes[k], want.codes[k]) << k;
}

TEST(ConvPoolCpuTest, GradientsAreTheWinnersSums) {
  uint32_t seed = 40;
  for (const Case& c : cases()) {
    for (bool channels_last : {false, true}) {
      SCOPED_TRACE(c.name + (channels_last ? ", channels last" : ", NCHW"));
      const Data d = make_data(c, channels_last, seed += 3);
      const Pooled fwd = run_forward(d);
      const Conv2dShape& s = d.s;
      const int64_t hp = conv_pool_h(s), wp = conv_pool_w(s), taps = s.c_in * s.kh * s.kw;
      const std::vector<float> dy = random_vector<float>(s.n * s.c_out * hp * wp, -1.0, 1.0, seed + 100);
      std::vector<double> want_w(s.c_out * taps, 0.0), want_b(s.c_out, 0.0);
      int64_t winners = 0;
      for (int64_t n = 0; n < s.n; ++n) {
        for (int64_t co = 0; co < s.c_out; ++co) {
          for (int64_t oh = 0; oh < hp; ++oh) {
            for (int64_t ow = 0; ow < wp; ++ow) {
              const uint8_t code = fwd.codes[((n * hp + oh) * wp + ow) * s.c_out + co];
              if (code == kNoWinner) continue;
              ++winners;
              const double g = dy[at(channels_last, s.c_out, hp, wp, n, co, oh, ow)];
              want_b[co] += g;
              const int64_t r = 2 * oh + code / 2, q = 2 * ow + code % 2;
              for (int64_t ci = 0; ci < s.c_in; ++ci) {
                for (int64_t i = 0; i < s.kh; ++i) {
                  for (int64_t j = 0; j < s.kw; ++j) {
                    const int64_t row = r + i - s.pad_h, col = q + j - s.pad_w;
                    if (row < 0 || row >= s.h || col < 0 || col >= s.w) continue;
                    want_w[((co * s.c_in + ci) * s.kh + i) * s.kw + j] +=
                        g * d.x[at(channels_last, s.c_in, s.h, s.w, n, ci, row, col)];
                  }
                }
              }
            }
          }
        }
      }
      ASSERT_GT(winners, 0);
      std::vector<float> dw(want_w.size(), -7.0f), db(want_b.size(), -7.0f);
      conv2d_relu_max_pool2d_backward_cpu(s, d.x.data(), dy.data(), fwd.codes.data(), dw.data(), db.data());
      for (size_t k = 0; k < want_w.size(); ++k) ASSERT_NEAR(dw[k], want_w[k], 1e-4 * (1 + std::abs(want_w[k]))) << k;
      for (size_t k = 0; k < want_b.size(); ++k) ASSERT_NEAR(db[k], want_b[k], 1e-4 * (1 + std::abs(want_b[k]))) << k;
      // Each gradient alone is the same (the bias's without x).
      std::vector<float> dw_only(dw.size()), db_only(db.size());
      conv2d_relu_max_pool2d_backward_cpu(s, d.x.data(), dy.data(), fwd.codes.data(), dw_only.data(), nullptr);
      conv2d_relu_max_pool2d_backward_cpu(s, nullptr, dy.data(), fwd.codes.data(), nullptr, db_only.data());
      EXPECT_EQ(dw_only, dw);
      EXPECT_EQ(db_only, db);
    }
  }
}

TEST(ConvPoolCpuTest, TheSameBitsOnOneAndTwoThreads) {
  const Case c{"batch of 64", 64, 1, 28, 28, 32, 3, 3, 1, 1};
  for (bool channels_last : {false, true}) {
    const Data d = make_data(c, channels_last, 77);
    const std::vector<float> dy =
        random_vector<float>(c.n * c.c_out * conv_pool_h(d.s) * conv_pool_w(d.s), -1.0, 1.0, 78);
    auto run = [&](int threads) {
      std::pair<Pooled, std::vector<float>> out;
      tbb::task_arena(threads).execute([&] {
        out.first = run_forward(d);
        out.second.assign(c.c_out * 9 + c.c_out, 0.0f);
        conv2d_relu_max_pool2d_backward_cpu(d.s, d.x.data(), dy.data(), out.first.codes.data(), out.second.data(),
                                            out.second.data() + c.c_out * 9);
      });
      return out;
    };
    const auto one = run(1), two = run(2);
    EXPECT_EQ(one.first.y, two.first.y);
    EXPECT_EQ(one.first.codes, two.first.codes);
    EXPECT_EQ(one.second, two.second);
  }
}

TEST(ConvPoolCpuTest, AppliesToFirstConvolutionsOnly) {
  Conv2dShape s = shape_of(cases()[0], false);
  EXPECT_TRUE(conv2d_relu_max_pool2d_applies(s));
  Conv2dShape many = s;
  many.c_in = 4;  // 36 products per output
  EXPECT_FALSE(conv2d_relu_max_pool2d_applies(many));
  Conv2dShape strided = s;
  strided.stride_w = 2;
  EXPECT_FALSE(conv2d_relu_max_pool2d_applies(strided));
  Conv2dShape dilated = s;
  dilated.dil_h = 2;
  EXPECT_FALSE(conv2d_relu_max_pool2d_applies(dilated));
  Conv2dShape doubles = s;
  doubles.dtype = DType::Float64;
  EXPECT_FALSE(conv2d_relu_max_pool2d_applies(doubles));
  Conv2dShape one_column = s;
  one_column.w = 1;
  one_column.pad_w = 0;
  one_column.kw = 1;  // a convolution output one column wide: no window
  EXPECT_FALSE(conv2d_relu_max_pool2d_applies(one_column));
  Conv2dShape empty = s;
  empty.n = 0;
  EXPECT_FALSE(conv2d_relu_max_pool2d_applies(empty));
}

}  // namespace
}  // namespace dpe::kernels
