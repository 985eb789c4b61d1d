// Where the samples of a batch run: chunk i belongs to device i in both modes, also when a device before the
// last has a zero share (weights {3, 0, 1}: the middle device runs nothing; {1, 1, 10} at 7 samples: 1, 0, 6).
// Observed from inside the replicas (each forward records its device and rows), not from the report alone.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "core/autograd/grad_mode.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "tests/testing/compare.h"
#include "tests/testing/devices.h"

namespace dpe {
namespace {

using testing::cpu_devices;

// Rows each device's replica ran forward on, summed over calls; shared by every replica of one model.
struct RowsPerDevice {
  std::mutex mutex;
  std::map<Device, int64_t> rows;
};

class Recorder : public nn::Cloneable<Recorder> {
 public:
  Recorder() : Cloneable("Recorder") { reset(); }
  void reset() override { fc = register_module("fc", std::make_shared<nn::Linear>(4, 2)); }
  Tensor forward(const Tensor& x) override {
    {
      std::lock_guard lock(log->mutex);
      log->rows[x.device()] += x.size(0);
    }
    return fc->forward(x);
  }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<RowsPerDevice> log = std::make_shared<RowsPerDevice>();  // copied into clones: shared
};

Tensor mse(const Tensor& out, const Tensor& target) { return nn::functional::mse_loss(out, target); }

// Rows per device index (0 for a device that never ran), after one step of `batch` rows.
std::vector<int64_t> rows_after_step(ParallelMode mode, const std::vector<double>& weights, int64_t batch,
                                     bool step_api) {
  auto model = std::make_shared<Recorder>();
  DataParallel dp(model, {.device_ids = cpu_devices(3), .split = SplitRule::Weighted, .split_weights = weights,
                          .mode = mode});
  const Tensor x = randn({batch, 4}), y = randn({batch, 2});
  if (step_api) {
    dp.forward_backward(x, y, mse);
  } else {
    NoGradGuard no_grad;
    dp.forward(x);
  }
  std::vector<int64_t> rows;
  for (const Device& d : cpu_devices(3)) rows.push_back(model->log->rows[d]);
  return rows;
}

TEST(BatchSplit, EachChunkRunsOnItsOwnDeviceInEveryMode) {
  struct Case {
    std::vector<double> weights;
    int64_t batch;
    std::vector<int64_t> rows;  // per device
  };
  for (const Case& c : {Case{{1, 1, 10}, 7, {1, 0, 6}}, Case{{3, 0, 1}, 4, {3, 0, 1}}, Case{{0, 1, 1}, 6, {0, 3, 3}},
                        Case{{1, 1, 0}, 6, {3, 3, 0}}}) {
    for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
      for (bool step_api : {true, false}) {
        SCOPED_TRACE(::testing::Message() << mode_name(mode) << (step_api ? " forward_backward" : " forward")
                                          << " batch " << c.batch);
        EXPECT_EQ(rows_after_step(mode, c.weights, c.batch, step_api), c.rows);
      }
    }
  }
}

TEST(BatchSplit, TheReportAndChunkSizesAreInDeviceOrder) {
  DataParallel dp(std::make_shared<Recorder>(), {.device_ids = cpu_devices(3), .split = SplitRule::Weighted,
                                                 .split_weights = {3, 0, 1}});
  EXPECT_EQ(dp.chunk_sizes(4), (std::vector<int64_t>{3, 0, 1}));
  dp.forward_backward(randn({4, 4}), randn({4, 2}), mse);
  EXPECT_EQ(dp.last_step().chunk_sizes, (std::vector<int64_t>{3, 0, 1}));
  EXPECT_EQ(dp.last_step().used_devices, (std::vector<Device>{Device::cpu(0), Device::cpu(2)}));
}

// A master with no sample of its own still gets the whole batch's gradient (the others' reduced into it),
// and an empty device in the middle changes nothing: the gradients are one device's on the full batch.
TEST(BatchSplit, EmptyDevicesLeaveTheGradientsOfTheFullBatch) {
  const Tensor x = randn({6, 4}), y = randn({6, 2});
  auto reference_model = std::make_shared<Recorder>();
  DataParallel one(reference_model, {.device_ids = cpu_devices(1)});
  one.forward_backward(x, y, mse);
  for (const std::vector<double>& weights : std::vector<std::vector<double>>{{0, 1, 1}, {1, 0, 1}}) {
    for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
      SCOPED_TRACE(::testing::Message() << mode_name(mode) << " weights " << weights[0] << "," << weights[1]);
      auto model = std::static_pointer_cast<Recorder>(reference_model->clone(Device::cpu(0)));
      model->zero_grad();
      DataParallel dp(model, {.device_ids = cpu_devices(3), .split = SplitRule::Weighted, .split_weights = weights,
                              .mode = mode});
      dp.forward_backward(x, y, mse);
      const std::vector<Tensor> expected = reference_model->parameters(), got = dp.module().parameters();
      for (size_t k = 0; k < expected.size(); ++k) {
        ASSERT_TRUE(got[k].grad().defined());
        EXPECT_LT(testing::max_relative_diff(got[k].grad(), expected[k].grad()), 1e-5);
      }
    }
  }
}

}  // namespace
}  // namespace dpe
