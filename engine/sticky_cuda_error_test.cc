// Asked on a GPU: how far does a sticky CUDA error reach? One DDP replica's kernel writes
// through an illegal address under on_device_failure = drop_device. cudaErrorIllegalAddress is sticky: every
// later call in that GPU's CUDA context fails with it, for the life of the process (CUDA's documented rule).
// - Two GPUs (cuda:0, cuda:1 on different physical GPUs): the error is confined to cuda:1's context, so dpe
//   drops cuda:1 and finishes the same step on cuda:0.
// - One GPU (cuda:0 and cuda:1 logical devices on it): both share the one context, so no device survives;
//   dpe must end the step with the CUDA error named (no hang, no abort), and CPU work must go on.
// Its own binary, one test: after the fault nothing else in this process may use that GPU. Left out of the
// compute-sanitizer runs (tools/gpu/run_suite.sh), whose memcheck would report the planted write.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>

#include "core/dispatch.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "layers/activation.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "optim/sgd.h"
#include "tests/testing/errors.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#include "tests/testing/cuda_fault.h"
#endif

namespace dpe {
namespace {

using testing::error_of;

#if DPE_WITH_CUDA
std::atomic<bool> armed{false};

// A Linear - ReLU - Linear whose replica on cuda:1 launches the faulting kernel in forward while `armed`.
class FaultsOnCuda1 : public nn::Cloneable<FaultsOnCuda1> {
 public:
  FaultsOnCuda1() : Cloneable("FaultsOnCuda1") { reset(); }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(6, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 3));
  }
  Tensor forward(const Tensor& x) override {
    if (armed && x.device() == Device::cuda(1)) {
      dispatch(x.device(), [] {}, [](auto stream) { testing::launch_illegal_write(stream); });
    }
    return fc2->forward(relu(fc1->forward(x)));
  }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

Tensor loss_fn(const Tensor& out, const Tensor& target) { return nn::functional::mse_loss(out, target); }

TEST(StickyCudaErrorTest, AnIllegalAddressInOneReplica) {
  const int gpus = cuda::physical_device_count();
  if (gpus == 0) GTEST_SKIP() << "no GPU: " << cuda::unavailable_reason();
  if (gpus == 1) set_cuda_logical_devices({0, 0});
  manual_seed(5);
  auto model = std::make_shared<FaultsOnCuda1>();
  model->to(Device::cuda(0));
  DataParallel dp(model,
                  {.device_ids = std::vector<Device>{Device::cuda(0), Device::cuda(1)}, .mode = ParallelMode::DDP,
                   .timeout = std::chrono::seconds(30), .on_device_failure = DeviceFailurePolicy::DropDevice});
  dp.set_optimizer([](const std::vector<Tensor>& p) {
    return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  });
  Tensor x = randn({8, 6}), y = randn({8, 3});
  dp.train_step(x, y, loss_fn);

  armed = true;
  const auto start = std::chrono::steady_clock::now();
  const std::string error = error_of([&] { dp.train_step(x, y, loss_fn); });
  armed = false;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ observed ] %d GPU(s); the faulting step took %.2f s; error: '%s'; devices left:", gpus, seconds,
              error.c_str());
  for (const Device& d : dp.device_ids()) std::printf(" %s", d.str().c_str());
  std::printf("; recovered:");
  for (const std::string& r : dp.last_step().recovered_failures) std::printf(" '%s'", r.c_str());
  std::printf("\n");

  if (gpus >= 2) {
    EXPECT_EQ(error, "(no error)");
    EXPECT_EQ(dp.device_ids(), std::vector<Device>{Device::cuda(0)});
    ASSERT_EQ(dp.last_step().recovered_failures.size(), 1u);
    EXPECT_NE(dp.last_step().recovered_failures[0].find("illegal memory access"), std::string::npos);
    dp.train_step(x, y, loss_fn);  // cuda:0 trains on
  } else {
    EXPECT_NE(error.find("illegal memory access"), std::string::npos) << error;
  }

  // CPU devices are not touched by it.
  EXPECT_EQ((ones({4}) + ones({4})).to_vector<float>(), std::vector<float>(4, 2.0f));
  // The faulting GPU's context stays broken (cuda:1 is on it whether it is one GPU or two): a new tensor there
  // fails, naming the error.
  const std::string after = error_of([] { (void)zeros({4}, Device::cuda(1)).to(Device::cpu(0)); });
  std::printf("[ observed ] a new tensor on the faulting GPU afterwards: '%s'\n", after.c_str());
  EXPECT_NE(after.find("illegal memory access"), std::string::npos) << after;
}
#else
TEST(StickyCudaErrorTest, AnIllegalAddressInOneReplica) { GTEST_SKIP() << "no CUDA support in this build"; }
#endif

}  // namespace
}  // namespace dpe
