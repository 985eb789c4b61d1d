// core/kernels/batch_norm_pieces.h, on the host: the cut, the values each block's threads visit, and the merge
// of the pieces' moments, as the CUDA batch-norm reductions run them (Note [Batch-norm reductions on CUDA]).
#include "core/kernels/batch_norm_pieces.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace dpe::kernels::detail {
namespace {

struct Shape {
  int64_t n, c, s;
};

// Every block of every thread count visits each value of its channel's range once, in the thread's order
// (positions thread, thread + threads, ...), and the blocks of a channel cover the channel exactly.
TEST(BatchNormPieces, BlocksVisitEveryValueOfTheirChannelOnce) {
  for (const Shape& sh : {Shape{256, 64, 196}, Shape{4, 3, 5}, Shape{300, 2, 1}, Shape{1, 1, 9000},
                          Shape{7, 1, 100000}, Shape{2048, 512, 1}, Shape{3, 700, 49}}) {
    const int64_t m = sh.n * sh.s;
    const BatchNormSplit split = batch_norm_split(sh.c, m);
    ASSERT_GE(split.pieces, 1);
    ASSERT_LE(split.pieces * (split.len - 1), m - 1) << "an empty piece";
    for (int64_t threads : {32, 256}) {
      std::vector<int> seen(static_cast<size_t>(sh.n * sh.c * sh.s), 0);
      for (int64_t block = 0; block < sh.c * split.pieces; ++block) {
        const BatchNormPiece p = batch_norm_piece(block, split, m);
        ASSERT_LT(p.lo, p.hi);
        for (int64_t t = 0; t < threads; ++t) {
          int64_t want = p.lo + t;
          for_each_in_piece(p, sh.c, sh.s, t, threads, [&](int64_t offset) {
            ASSERT_EQ(offset, (want / sh.s * sh.c + p.c) * sh.s + want % sh.s)
                << "shape (" << sh.n << ", " << sh.c << ", " << sh.s << "), block " << block << ", thread " << t;
            ++seen[static_cast<size_t>(offset)];
            want += threads;
          });
          ASSERT_GE(want, p.hi);
        }
      }
      for (size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k], 1) << "element " << k;
    }
  }
}

// Enough blocks for a GPU where the channels are few, never pieces below 4096 values, one piece for small M.
// (Named without "Gpu": run_suite.sh picks the CUDA tests by name, and this one makes no CUDA call.)
TEST(BatchNormPieces, TheSplitFillsTheDeviceWithoutTinyPieces) {
  EXPECT_EQ(batch_norm_split(64, 256 * 196).pieces, 8);  // the CNN's BatchNorm: 512 blocks
  EXPECT_EQ(batch_norm_split(1, 4096).pieces, 1);
  EXPECT_EQ(batch_norm_split(1, 1 << 20).pieces, 256);
  EXPECT_EQ(batch_norm_split(1024, 1 << 20).pieces, 1);
  EXPECT_EQ(batch_norm_split(5, 0).pieces, 1);
}

// Chan's merge of the pieces' moments equals the two-pass mean and variance of all values, in any cut.
TEST(BatchNormPieces, MergedMomentsEqualTheWholeChannels) {
  std::mt19937 rng(3);
  std::normal_distribution<double> normal(1000.0, 0.01);  // a large mean: where E[x^2] - E[x]^2 would cancel
  std::vector<double> x(10007);
  for (double& v : x) v = normal(rng);
  double mean = 0;
  for (double v : x) mean += v;
  mean /= static_cast<double>(x.size());
  double m2 = 0;
  for (double v : x) m2 += (v - mean) * (v - mean);
  for (size_t len : {size_t{1}, size_t{7}, size_t{4096}, x.size()}) {
    RunningMoments all;
    for (size_t lo = 0; lo < x.size(); lo += len) {
      const size_t hi = std::min(lo + len, x.size());
      double piece_mean = 0, piece_m2 = 0;
      for (size_t i = lo; i < hi; ++i) piece_mean += x[i];
      piece_mean /= static_cast<double>(hi - lo);
      for (size_t i = lo; i < hi; ++i) piece_m2 += (x[i] - piece_mean) * (x[i] - piece_mean);
      all.merge(static_cast<double>(hi - lo), piece_mean, piece_m2);
    }
    EXPECT_EQ(all.count, static_cast<double>(x.size()));
    EXPECT_NEAR(all.mean, mean, 1e-12 * mean) << "pieces of " << len;
    EXPECT_NEAR(all.m2 / all.count, m2 / static_cast<double>(x.size()), 1e-9 * m2 / static_cast<double>(x.size()))
        << "pieces of " << len;
  }
}

}  // namespace
}  // namespace dpe::kernels::detail
