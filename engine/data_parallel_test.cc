#include "engine/data_parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>

#include "core/autograd/function.h"
#include "core/autograd/grad_mode.h"
#include "core/ops.h"
#include "layers/activation.h"
#include "layers/containers.h"
#include "layers/conv.h"
#include "layers/linear.h"
#include "layers/pooling.h"
#include "tests/testing/compare.h"
#include "tests/testing/errors.h"
#include "tests/testing/devices.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#endif

namespace dpe {
namespace {

using nn::Cloneable;
using nn::Linear;

using testing::cpu_devices;

class Mlp : public Cloneable<Mlp> {
 public:
  Mlp() : Cloneable("Mlp") { reset(); }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<Linear>(6, 16));
    fc2 = register_module("fc2", std::make_shared<Linear>(16, 3));
  }
  Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }
  std::shared_ptr<Linear> fc1, fc2;
};

// A module whose buffer counts the rows it has seen (a stand-in for BatchNorm's running stats).
class Counter : public Cloneable<Counter> {
 public:
  Counter() : Cloneable("Counter") { reset(); }
  void reset() override {
    fc = register_module("fc", std::make_shared<Linear>(2, 2));
    seen = register_buffer("seen", zeros({1}));
  }
  Tensor forward(const Tensor& x) override {
    {
      NoGradGuard no_grad;
      seen.add_(full({1}, static_cast<double>(x.size(0))));
    }
    return fc->forward(x);
  }
  std::shared_ptr<Linear> fc;
  Tensor seen;
};

using dpe::testing::error_of;

using testing::max_relative_diff;

TEST(DataParallelTest, GradientsEqualTheSingleDeviceFullBatch) {
  auto devices = cpu_devices(4);
  for (auto [batch, n] : std::vector<std::pair<int64_t, int>>{{5, 3}, {4, 3}, {7, 2}, {8, 4}, {10, 4}, {1, 4}}) {
    manual_seed(batch * 10 + n);
    auto model = std::make_shared<Mlp>();
    auto reference = nn::clone_module(*model, Device::cpu(0));
    Tensor x = randn({batch, 6});
    Tensor target = randn({batch, 3});
    DataParallel dp(model, {.device_ids = std::vector<Device>(devices.begin(), devices.begin() + n),
                            .bucket_bytes = 256});  // small buckets: several reductions, some overlapped
    Tensor out = dp.forward(x);
    Tensor expected_out = reference->forward(x);
    EXPECT_LT(max_relative_diff(out, expected_out), 1e-6) << batch << "/" << n;  // rows in input order
    mean(square(out - target)).backward();
    mean(square(expected_out - target)).backward();
    auto got = model->named_parameters(), want = reference->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].second.grad().defined()) << got[i].first;
      EXPECT_LT(max_relative_diff(got[i].second.grad(), want[i].second.grad()), 1e-5)
          << got[i].first << " batch " << batch << " on " << n << " devices";
    }
    EXPECT_EQ(dp.last_step().used_devices.size(), compute_chunk_sizes(batch, n).size());
  }
}

TEST(DataParallelTest, CnnGradientsEqualTheSingleDeviceFullBatch) {
  auto devices = cpu_devices(3);
  manual_seed(5);
  auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(1, 4, 3, 1, 1), std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
      std::make_shared<nn::Flatten>(), std::make_shared<Linear>(4 * 4 * 4, 5)});
  auto reference = model->clone(Device::cpu(0));
  Tensor x = randn({7, 1, 8, 8});  // chunks 3, 3, 1
  DataParallel dp(model, {.device_ids = devices});
  Tensor out = dp.forward(x);
  Tensor expected = reference->forward(x);
  EXPECT_LT(max_relative_diff(out, expected), 1e-6);
  sum(square(out)).backward();
  sum(square(expected)).backward();
  auto got = model->named_parameters(), want = reference->named_parameters();
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LT(max_relative_diff(got[i].second.grad(), want[i].second.grad()), 1e-5) << got[i].first;
  }
}

TEST(DataParallelTest, SgdStepsMatchSingleDevice) {
  auto devices = cpu_devices(2);
  manual_seed(1);
  auto model = std::make_shared<Mlp>();
  auto reference = nn::clone_module(*model, Device::cpu(0));
  DataParallel dp(model, {.device_ids = devices});
  for (int step = 0; step < 4; ++step) {
    Tensor x = randn({6, 6}), target = randn({6, 3});
    mean(square(dp.forward(x) - target)).backward();
    mean(square(reference->forward(x) - target)).backward();
    NoGradGuard no_grad;
    for (auto* m : {static_cast<nn::Module*>(model.get()), static_cast<nn::Module*>(reference.get())}) {
      for (Tensor p : m->parameters()) p.add_(p.grad(), -0.1);
      m->zero_grad();
    }
  }
  auto got = model->parameters(), want = reference->parameters();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_LT(max_relative_diff(got[i], want[i]), 1e-5);
  EXPECT_EQ(dp.replicas_created(), 1);  // built once, at construction
  EXPECT_EQ(dp.threads_created(), 2);   // no thread per step
}

TEST(DataParallelTest, MasterGradAccumulatesAcrossBackwardsLikePyTorch) {
  auto devices = cpu_devices(2);
  auto model = std::make_shared<Mlp>();
  auto reference = nn::clone_module(*model, Device::cpu(0));
  DataParallel dp(model, {.device_ids = devices});
  Tensor x = randn({4, 6});
  for (int k = 0; k < 2; ++k) {
    sum(dp.forward(x)).backward();
    sum(reference->forward(x)).backward();
  }
  EXPECT_LT(max_relative_diff(model->fc1->weight.grad(), reference->fc1->weight.grad()), 1e-5);
}

TEST(DataParallelTest, InputGradientsAndOutputDevice) {
  auto devices = cpu_devices(3);
  auto model = std::make_shared<Mlp>();
  auto reference = nn::clone_module(*model, Device::cpu(0));
  DataParallel dp(model, {.device_ids = devices, .output_device = Device::cpu(2)});
  Tensor x = randn({5, 6}).set_requires_grad(true);
  Tensor x_ref = x.detach().clone().set_requires_grad(true);
  Tensor out = dp.forward(x);
  EXPECT_EQ(out.device(), Device::cpu(2));
  sum(out).backward();
  sum(reference->forward(x_ref)).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().device(), Device::cpu(0));
  EXPECT_LT(max_relative_diff(x.grad(), x_ref.grad()), 1e-5);
}

TEST(DataParallelTest, SingleDeviceIsTheModuleItself) {
  auto devices = cpu_devices(1);
  auto model = std::make_shared<Mlp>();
  auto reference = nn::clone_module(*model, Device::cpu(0));
  DataParallel dp(model, {.device_ids = std::vector<Device>{Device::cpu(0)}});
  Tensor x = randn({5, 6});
  Tensor out = dp.forward(x);
  EXPECT_TRUE(equal(out, reference->forward(x)));  // bit for bit
  sum(out).backward();
  sum(reference->forward(x)).backward();
  EXPECT_TRUE(equal(model->fc1->weight.grad(), reference->fc1->weight.grad()));
  EXPECT_EQ(dp.replicas_created(), 0);
  EXPECT_EQ(dp.last_step().broadcast.bytes, 0);
  EXPECT_EQ(dp.last_step().reduce.bytes, 0);
}

TEST(DataParallelTest, EvalForwardBuildsNoGraph) {
  auto devices = cpu_devices(2);
  auto model = std::make_shared<Mlp>();
  DataParallel dp(model, {.device_ids = devices});
  NoGradGuard no_grad;
  Tensor out = dp.forward(randn({4, 6}));
  EXPECT_FALSE(out.requires_grad());
  EXPECT_EQ(out.grad_fn(), nullptr);
}

TEST(DataParallelTest, BufferPolicies) {
  auto devices = cpu_devices(2);
  {
    auto model = std::make_shared<Counter>();
    DataParallel dp(model, {.device_ids = devices});
    dp.forward(randn({5, 2}));  // chunks 3, 2
    EXPECT_EQ(model->seen.item(), 3.0);  // PyTorch: replica 0's update persists, the others' are lost
    dp.forward(randn({5, 2}));
    EXPECT_EQ(model->seen.item(), 6.0);  // replicas start each step from the master's buffers
  }
  {
    auto model = std::make_shared<Counter>();
    DataParallel dp(model, {.device_ids = devices, .buffers = BufferPolicy::Average});
    dp.forward(randn({5, 2}));
    EXPECT_EQ(model->seen.item(), 2.5);  // (3 + 2) / 2
  }
}

TEST(DataParallelTest, ReportsChunksBytesAndMemory) {
  auto devices = cpu_devices(3);
  auto model = std::make_shared<Mlp>();
  DataParallel dp(model, {.device_ids = devices, .split = SplitRule::Balanced});
  Tensor out = dp.forward(randn({4, 6}));
  sum(out).backward();
  const StepReport& r = dp.last_step();
  EXPECT_EQ(r.chunk_sizes, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(r.used_devices.size(), 3u);
  int64_t param_bytes = (6 * 16 + 16 + 16 * 3 + 3) * 4;
  EXPECT_EQ(r.broadcast.bytes, 2 * param_bytes);  // to each of the 2 other replicas
  EXPECT_EQ(r.reduce.bytes, 2 * param_bytes);     // from each of them
  EXPECT_EQ(r.memory.size(), 3u);
  EXPECT_GT(r.memory[0].second.peak_allocated_bytes, 0);
  EXPECT_GE(r.buckets, 1);
  // The last hook that completes a bucket reduces it right away, on a worker, during backward.
  EXPECT_GE(r.buckets_reduced_during_backward, 1);
}

TEST(DataParallelTest, DeviceValidation) {
  cpu_devices(2);
  auto model = std::make_shared<Mlp>();
  EXPECT_NE(error_of([&] { DataParallel(model, {.device_ids = std::vector<Device>{}}); }).find("device_ids is empty"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              DataParallel(model, {.device_ids = std::vector<Device>{Device::cpu(0), Device::cpu(1), Device::cpu(0)}});
            }).find("contains cpu:0 more than once"),
            std::string::npos);
  std::string out_of_range = error_of([&] { DataParallel(model, {.device_ids = std::vector<Device>{Device::cpu(0), Device::cpu(500)}}); });
  EXPECT_NE(out_of_range.find("cpu:500 does not exist"), std::string::npos) << out_of_range;
  EXPECT_NE(error_of([&] {
              DataParallel(model, {.device_ids = std::vector<Device>{Device::cpu(0), Device::cuda(0)}});
            }).find("mixes cpu:0 and cuda:0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DataParallel(model, {.device_ids = std::vector<Device>{Device::cpu(0)}, .output_device = Device::cpu(77)}); })
                .find("output_device"),
            std::string::npos);
  auto elsewhere = std::make_shared<Mlp>();
  elsewhere->to(Device::cpu(1));
  std::string placement = error_of([&] { DataParallel(elsewhere, {.device_ids = std::vector<Device>{Device::cpu(0), Device::cpu(1)}}); });
  EXPECT_NE(placement.find("device_ids[0] = cpu:0 but 'fc1.weight' is on cpu:1"), std::string::npos) << placement;
}

class FailsOnSmallChunks : public Cloneable<FailsOnSmallChunks> {
 public:
  FailsOnSmallChunks() : Cloneable("FailsOnSmallChunks") { reset(); }
  void reset() override { fc = register_module("fc", std::make_shared<Linear>(2, 2)); }
  Tensor forward(const Tensor& x) override {
    DPE_CHECK(x.size(0) > 1, "chunk of ", x.size(0), " rows is too small");
    return fc->forward(x);
  }
  std::shared_ptr<Linear> fc;
};

TEST(DataParallelTest, ReplicaFailureIsReportedOnceAndTheNextStepWorks) {
  auto devices = cpu_devices(2);
  DataParallel dp(std::make_shared<FailsOnSmallChunks>(), {.device_ids = devices});
  try {
    dp.forward(randn({3, 2}));  // chunks 2, 1
    ADD_FAILURE();
  } catch (const ReplicaError& e) {
    EXPECT_EQ(e.replica(), 1);
    EXPECT_NE(std::string(e.what()).find("replica 1 on cpu:1: chunk of 1 rows is too small"), std::string::npos)
        << e.what();
  }
  Tensor out = dp.forward(randn({4, 2}));
  sum(out).backward();
  EXPECT_EQ(out.size(0), 4);
}

// y = fc(x) * scale + bias_term[named "shift"], with a non-tensor option "scale" and a second output sum(y).
class TwoInputs : public Cloneable<TwoInputs> {
 public:
  TwoInputs() : Cloneable("TwoInputs") { reset(); }
  void reset() override { fc = register_module("fc", std::make_shared<Linear>(3, 2)); }
  std::vector<Tensor> forward_args(const nn::ModuleInput& in) override {
    Tensor y = fc->forward(in.tensor(0)) * in.value<double>("scale") + in.tensor("shift");
    return {y, sum(y)};
  }
  std::shared_ptr<Linear> fc;
};

TEST(DataParallelTest, StructuredInputsAndOutputs) {
  auto devices = cpu_devices(3);
  auto model = std::make_shared<TwoInputs>();
  auto reference = nn::clone_module(*model, Device::cpu(0));
  DataParallel dp(model, {.device_ids = devices});
  Tensor x = randn({5, 3}).set_requires_grad(true), shift = randn({5, 2});
  Tensor x_ref = x.detach().clone().set_requires_grad(true);
  nn::ModuleInput input({x}, {{"scale", 2.0}, {"shift", shift}});
  std::vector<Tensor> out = dp.forward_args(input);
  std::vector<Tensor> expected = reference->forward_args(nn::ModuleInput({x_ref}, {{"scale", 2.0}, {"shift", shift}}));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_LT(max_relative_diff(out[0], expected[0]), 1e-6);
  EXPECT_EQ(out[1].shape(), (Shape{3}));  // per-replica scalars become a vector (chunks 2, 2, 1)
  EXPECT_NEAR(sum(out[1]).item(), expected[1].item(), 1e-4);
  (sum(out[0]) + sum(out[1])).backward();
  (sum(expected[0]) + expected[1]).backward();
  EXPECT_LT(max_relative_diff(model->fc->weight.grad(), reference->fc->weight.grad()), 1e-5);
  EXPECT_LT(max_relative_diff(x.grad(), x_ref.grad()), 1e-5);

  // Tensor arguments must agree on the batch size, checked before anything runs.
  std::string message = error_of([&] { dp.forward_args(nn::ModuleInput({randn({5, 3})}, {{"shift", randn({4, 2})}})); });
  EXPECT_NE(message.find("differ in size along dim 0: argument 0 has 5, argument 'shift' has 4"), std::string::npos)
      << message;
  // A module that takes one tensor refuses more, naming them.
  DataParallel plain(std::make_shared<Mlp>(), {.device_ids = devices});
  EXPECT_NE(error_of([&] { plain.forward_args(nn::ModuleInput({randn({4, 6}), randn({4, 6})})); }).find("takes one tensor"),
            std::string::npos);
}

TEST(DataParallelTest, NoTensorArgumentsRunOnceOnTheFirstDevice) {
  class Constant : public Cloneable<Constant> {
   public:
    Constant() : Cloneable("Constant") { reset(); }
    void reset() override { w = register_parameter("w", ones({2})); }
    std::vector<Tensor> forward_args(const nn::ModuleInput& in) override {
      return {w * static_cast<double>(in.value<int64_t>("times"))};
    }
    Tensor w;
  };
  auto devices = cpu_devices(2);
  auto model = std::make_shared<Constant>();
  DataParallel dp(model, {.device_ids = devices});
  std::vector<Tensor> out = dp.forward_args(nn::ModuleInput({}, {{"times", int64_t{3}}}));
  EXPECT_EQ(out[0].to_vector<float>(), (std::vector<float>{3, 3}));
  EXPECT_EQ(dp.last_step().used_devices, (std::vector<Device>{Device::cpu(0)}));
  sum(out[0]).backward();
  EXPECT_EQ(model->w.grad().to_vector<float>(), (std::vector<float>{3, 3}));
}

// Fails in backward on a chunk of one row (forward succeeds).
class FailsInBackward : public Cloneable<FailsInBackward> {
 public:
  FailsInBackward() : Cloneable("FailsInBackward") { reset(); }
  void reset() override { fc = register_module("fc", std::make_shared<Linear>(2, 2)); }
  Tensor forward(const Tensor& x) override {
    Tensor y = fc->forward(x);
    if (x.size(0) != 1) return y;
    Tensor z = y.detach().clone();
    autograd::record(z, {y}, "FailingBackward", [](const Tensor&) -> std::vector<Tensor> {
      DPE_CHECK(false, "gradient exploded");
    });
    return z;
  }
  std::shared_ptr<Linear> fc;
};

TEST(DataParallelTest, BackwardFailureIsReportedOnceAndTheNextStepWorks) {
  auto devices = cpu_devices(2);
  auto model = std::make_shared<FailsInBackward>();
  DataParallel dp(model, {.device_ids = devices});
  Tensor out = dp.forward(randn({3, 2}));  // chunks 2, 1: replica 1 fails in backward
  try {
    sum(out).backward();
    ADD_FAILURE() << "no exception";
  } catch (const ReplicaError& e) {
    EXPECT_EQ(e.replica(), 1);
    EXPECT_NE(std::string(e.what()).find("replica 1 on cpu:1: gradient exploded"), std::string::npos) << e.what();
  }
  model->zero_grad();
  sum(dp.forward(randn({4, 2}))).backward();  // chunks 2, 2: the same engine works again
  EXPECT_TRUE(model->fc->weight.grad().defined());
}

// Every CUDA device this process sees: the GPU suite runs it on 2 and 4 logical devices of one GPU.
TEST(DataParallelCudaTest, GradientsEqualTheSingleDeviceFullBatch) {
  if (cuda_device_count() < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices (on one GPU: DPE_CUDA_LOGICAL_DEVICES=0,0)";
  }
  std::vector<Device> devices;
  for (int i = 0; i < cuda_device_count(); ++i) devices.push_back(Device::cuda(i));
  manual_seed(2);
  auto model = std::make_shared<Mlp>();
  model->to(Device::cuda(0));
  auto reference = nn::clone_module(*model, Device::cuda(0));
  DataParallel dp(model, {.device_ids = devices, .bucket_bytes = 256});
  Tensor x = randn({7, 6}, Device::cuda(0)), target = randn({7, 3}, Device::cuda(0));
  Tensor out = dp.forward(x);
  Tensor expected = reference->forward(x);
  EXPECT_LT(max_relative_diff(out, expected), 1e-5);
  mean(square(out - target)).backward();
  mean(square(expected - target)).backward();
  auto got = model->named_parameters(), want = reference->named_parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LT(max_relative_diff(got[i].second.grad(), want[i].second.grad()), 1e-5) << got[i].first;
  }
}

#if DPE_WITH_CUDA
// One device takes a pinned batch as the scatter does: its copy is only enqueued (non_blocking), so forward
// returns while the device's stream is still held by a host callback; a synchronous copy would wait for it.
TEST(DataParallelCudaTest, OneDeviceForwardOnlyEnqueuesTheCopyOfAPinnedBatch) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device";
  manual_seed(3);
  auto model = std::make_shared<Mlp>();
  model->to(Device::cuda(0));
  DataParallel dp(model, {.device_ids = std::vector<Device>{Device::cuda(0)}});
  const Tensor x = randn({7, 6}).pin_memory();
  const Tensor expected = dp.forward(x).to(Device::cpu(0));  // also warms the allocators and handles
  std::atomic<bool> release{false};
  auto wait_for_release = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) {
    }
  };
  {
    cuda::DeviceGuard guard(0);
    ASSERT_EQ(cudaLaunchHostFunc(cuda::stream(0), wait_for_release, &release), cudaSuccess);
  }
  std::future<Tensor> out = std::async(std::launch::async, [&] { return dp.forward(x); });
  const bool returned_while_held = out.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  release.store(true);
  EXPECT_TRUE(returned_while_held) << "forward waited for the held stream: the pinned batch was copied synchronously";
  EXPECT_TRUE(equal(out.get().to(Device::cpu(0)), expected));
}
#endif

}  // namespace
}  // namespace dpe
