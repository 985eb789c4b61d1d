#include "scatter_gather/coalesced.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/ops.h"

namespace dpe {
namespace {

TEST(CoalescedTest, BucketsRespectCapAndDtype) {
  std::vector<Tensor> t = {zeros({100}), zeros({100}), zeros({300}), zeros({10}, DType::Float64), zeros({10})};
  // 400 B, 400 B, 1200 B, 80 B (float64), 40 B with a 1000-byte cap.
  auto buckets = plan_buckets(t, 1000);
  std::vector<std::pair<size_t, size_t>> expected = {{0, 2}, {2, 3}, {3, 4}, {4, 5}};
  EXPECT_EQ(buckets, expected);
  EXPECT_THROW(plan_buckets(t, 0), Error);
}

TEST(CoalescedTest, BroadcastCopiesEverything) {
  set_num_cpu_devices(std::max(num_cpu_devices(), 3));
  std::vector<Tensor> sources = {randn({3, 4}), randn({5}), arange(6, DType::Float64)};
  auto result = broadcast_coalesced(sources, {Device::cpu(0), Device::cpu(1), Device::cpu(2)}, 64);
  ASSERT_EQ(result.size(), 3u);
  EXPECT_TRUE(result[0][0].is_same(sources[0]));  // the source device gets the sources themselves
  for (int k = 1; k < 3; ++k) {
    for (size_t i = 0; i < sources.size(); ++i) {
      EXPECT_EQ(result[k][i].device(), Device::cpu(k));
      EXPECT_TRUE(equal(result[k][i], sources[i]));
      EXPECT_NE(result[k][i].storage(), sources[i].storage());
    }
  }
  std::vector<std::vector<Tensor>> dst = {{zeros({3, 4}, Device::cpu(1)), zeros({5}, Device::cpu(1)),
                                           zeros({6}, TensorOptions(DType::Float64).with_device(Device::cpu(1)))}};
  TransferStats stats = broadcast_coalesced_into(sources, dst);
  EXPECT_EQ(stats.bytes, 12 * 4 + 5 * 4 + 6 * 8);
  EXPECT_TRUE(equal(dst[0][2], sources[2]));
  EXPECT_THROW(broadcast_coalesced_into(sources, {{zeros({3, 4}), zeros({5})}}), Error);  // count mismatch
}

TEST(CoalescedTest, ReduceAddSumsInDeviceOrder) {
  set_num_cpu_devices(std::max(num_cpu_devices(), 3));
  std::vector<std::vector<Tensor>> inputs;
  for (int k = 0; k < 3; ++k) {
    inputs.push_back({full({2, 2}, k + 1.0, Device::cpu(k)), full({3}, 10.0 * (k + 1), Device::cpu(k))});
  }
  std::vector<Tensor> out = reduce_add_coalesced(inputs, Device::cpu(0), 16);
  EXPECT_EQ(out[0].to_vector<float>(), std::vector<float>(4, 6.0f));
  EXPECT_EQ(out[1].to_vector<float>(), std::vector<float>(3, 60.0f));
  EXPECT_EQ(out[0].device(), Device::cpu(0));
  EXPECT_THROW(reduce_add_coalesced({{zeros({2})}, {zeros({3})}}, Device::cpu(0)), Error);
}

TEST(CoalescedTest, AllocatingFormsAreDifferentiable) {
  set_num_cpu_devices(std::max(num_cpu_devices(), 3));
  Tensor w = ones({2, 2}).set_requires_grad(true);
  auto copies = broadcast_coalesced({w}, {Device::cpu(0), Device::cpu(1), Device::cpu(2)});
  // d/dw of sum over devices of k * sum(copy_k): the source receives the sum 0 + 1 + 2 per element.
  Device d0 = Device::cpu(0);
  sum(copies[0][0] * 0.0 + copies[1][0].to(d0) * 1.0 + copies[2][0].to(d0) * 2.0).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), std::vector<float>(4, 3.0f));

  Tensor a = ones({3}).set_requires_grad(true);
  Tensor b = ones({3}, Device::cpu(1)).set_requires_grad(true);
  std::vector<Tensor> total = reduce_add_coalesced({{a}, {b}}, Device::cpu(2));
  sum(total[0] * 4.0).backward();
  EXPECT_EQ(a.grad().to_vector<float>(), std::vector<float>(3, 4.0f));
  EXPECT_EQ(b.grad().device(), Device::cpu(1));
  EXPECT_EQ(b.grad().to_vector<float>(), std::vector<float>(3, 4.0f));
}

}  // namespace
}  // namespace dpe
