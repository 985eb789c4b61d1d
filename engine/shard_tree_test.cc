// tree_sum_buffers_cpu against the same tree added pairwise with Tensor::add_: the same bits for every shard
// count (odd ones included), both float dtypes, several outputs, and lengths that are not a whole block.
#include "engine/shard_tree.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/autograd/grad_mode.h"
#include "core/ops.h"

namespace dpe {
namespace {

// The reference: node [lo, hi) as a new tensor, children added pairwise.
Tensor pairwise(const std::vector<Tensor>& shards, size_t lo, size_t hi) {
  if (hi - lo == 1) return shards[lo].clone();
  const size_t mid = tree_split(lo, hi);
  Tensor left = pairwise(shards, lo, mid);
  return left.add_(pairwise(shards, mid, hi));
}

TEST(ShardTree, SplitGivesTheLeftChildTheLargerHalf) {
  EXPECT_EQ(tree_split(0, 2), 1u);
  EXPECT_EQ(tree_split(0, 3), 2u);
  EXPECT_EQ(tree_split(0, 4), 2u);
  EXPECT_EQ(tree_split(4, 9), 7u);
}

TEST(ShardTree, SumsWithTheBitsOfPairwiseAdds) {
  NoGradGuard no_grad;
  manual_seed(9);
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (size_t k = 1; k <= 9; ++k) {
      const int64_t count = 2500;  // two whole blocks and a part
      std::vector<Tensor> shards;
      // Mixed magnitudes, so that the order of the additions shows in the last bits.
      for (size_t s = 0; s < k; ++s) shards.push_back(randn({count}, TensorOptions(dtype)) * std::pow(10.0, static_cast<double>(s % 4)));
      std::vector<const void*> inputs;
      for (const Tensor& t : shards) inputs.push_back(t.data_ptr());
      Tensor a = Tensor::empty({count}, TensorOptions(dtype)), b = Tensor::empty({count}, TensorOptions(dtype));
      tree_sum_buffers_cpu(dtype, inputs, {a.data_ptr(), b.data_ptr()}, count);
      const Tensor want = pairwise(shards, 0, k);
      const size_t bytes = static_cast<size_t>(count) * element_size(dtype);
      EXPECT_EQ(std::memcmp(a.data_ptr(), want.data_ptr(), bytes), 0) << dtype << ", " << k << " shards";
      EXPECT_EQ(std::memcmp(b.data_ptr(), want.data_ptr(), bytes), 0) << dtype << ", " << k << " shards";
      if (k == 4) {  // a left fold would differ: the test can tell the tree from another order
        Tensor fold = shards[0].clone();
        for (size_t s = 1; s < k; ++s) fold.add_(shards[s]);
        EXPECT_NE(std::memcmp(fold.data_ptr(), want.data_ptr(), bytes), 0) << dtype;
      }
    }
  }
}

TEST(ShardTree, WritesOnlyTheCountItIsGiven) {
  NoGradGuard no_grad;
  Tensor x = ones({8}), y = ones({8}), out = zeros({8});
  tree_sum_buffers_cpu(DType::Float32, {x.data_ptr(), y.data_ptr()}, {static_cast<float*>(out.data_ptr()) + 2}, 3);
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{0, 0, 2, 2, 2, 0, 0, 0}));
}

}  // namespace
}  // namespace dpe
