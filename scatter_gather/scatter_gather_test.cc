#include "scatter_gather/scatter_gather.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/ops.h"
#include "scatter_gather/chunking.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/devices.h"

namespace dpe {
namespace {

using testing::cpu_devices;

TEST(ScatterGatherTest, ScatterThenGatherIsTheIdentity) {
  auto devices = cpu_devices(4);
  for (auto [batch, n] : std::vector<std::pair<int64_t, int>>{{5, 3}, {4, 3}, {10, 4}, {1, 4}, {8, 2}}) {
    Tensor x = randn({batch, 3});
    std::vector<Device> devs(devices.begin(), devices.begin() + n);
    std::vector<int64_t> sizes = compute_chunk_sizes(batch, n);
    std::vector<Tensor> chunks = scatter(x, devs, 0, sizes);
    ASSERT_EQ(chunks.size(), sizes.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      EXPECT_EQ(chunks[i].device(), devs[i]);
      EXPECT_EQ(chunks[i].size(0), sizes[i]);
    }
    EXPECT_TRUE(equal(gather(chunks, Device::cpu(0), 0), x));  // rows back in input order
  }
  // Along another dim, gathered on a non-master device.
  Tensor y = randn({2, 7});
  std::vector<Tensor> parts = scatter(y, devices, 1, compute_chunk_sizes(7, 4));
  Tensor back = gather(parts, Device::cpu(3), 1);
  EXPECT_EQ(back.device(), Device::cpu(3));
  EXPECT_TRUE(equal(back, y));
}

TEST(ScatterGatherTest, GradientsFlowBackThroughBoth) {
  auto devices = cpu_devices(3);
  Tensor x = testing::randn_leaf({5, 2}, 1);
  std::string report = testing::gradcheck(
      [&](const std::vector<Tensor>& in) {
        std::vector<Tensor> chunks = scatter(in[0], devices, 0, {2, 2, 1});
        for (Tensor& c : chunks) c = tanh(c);  // per-device work
        return gather(chunks, Device::cpu(1), 0);
      },
      {x});
  EXPECT_EQ(report, "");
  // A chunk without a gradient contributes zeros.
  Tensor w = ones({4, 2}).set_requires_grad(true);
  std::vector<Tensor> chunks = scatter(w, devices, 0, {2, 2});
  sum(chunks[1]).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{0, 0, 0, 0, 1, 1, 1, 1}));
}

TEST(ScatterGatherTest, ScalarsGatherIntoAVector) {
  auto devices = cpu_devices(2);
  Tensor a = scalar_tensor(1.5, TensorOptions(DType::Float32).with_requires_grad(true));
  Tensor b = scalar_tensor(2.5, TensorOptions(Device::cpu(1)));
  Tensor v = gather({a, b}, Device::cpu(0));
  EXPECT_EQ(v.shape(), (Shape{2}));
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{1.5f, 2.5f}));
  mean(v).backward();
  EXPECT_EQ(a.grad().item(), 0.5);
}

TEST(ScatterGatherTest, Errors) {
  auto devices = cpu_devices(2);
  try {
    gather({zeros({2, 3}), zeros({2, 4})}, Device::cpu(0), 0);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 1 has shape [2, 4] but input 0 has [2, 3]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(scatter(zeros({4}), devices, 0, {2, 1}), Error);        // sizes do not sum to 4
  EXPECT_THROW(scatter(zeros({4}), devices, 0, {1, 1, 1, 1}), Error);  // more chunks than devices
  EXPECT_THROW(scatter(scalar_tensor(1), devices, 0, {1}), Error);
  EXPECT_THROW(gather({zeros({2})}, Device::cpu(999)), Error);
}

}  // namespace
}  // namespace dpe
