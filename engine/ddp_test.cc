// DDP mode: bucket rules, replica identity, gradient equivalence (even and uneven shards), lock-step
// training against DP mode and a single device, no_sync, unused parameters, buffer broadcast, errors.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>

#include "core/allocator.h"
#include "core/autograd/function.h"
#include "core/autograd/grad_mode.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "engine/ddp_reducer.h"
#include "layers/activation.h"
#include "layers/batchnorm.h"
#include "layers/linear.h"
#include "layers/containers.h"
#include "layers/loss.h"
#include "layers/sync_batchnorm.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/testing/devices.h"
#include "tests/testing/compare.h"
#include "tests/testing/errors.h"
#include "tests/testing/failing_new.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#endif

namespace dpe {
namespace {

using nn::Cloneable;
using nn::Linear;
using testing::cpu_devices;
using testing::error_of;
using testing::max_relative_diff;

// Three layers; `skip` (when built with it) is a layer forward() never uses.
class Net : public Cloneable<Net> {
 public:
  explicit Net(int64_t width = 16, bool with_unused = false, bool with_bn = false)
      : Cloneable("Net"), width_(width), with_unused_(with_unused), with_bn_(with_bn) {
    reset();
  }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<Linear>(6, width_));
    if (with_bn_) bn = register_module("bn", std::make_shared<nn::BatchNorm1d>(width_));
    fc2 = register_module("fc2", std::make_shared<Linear>(width_, width_));
    if (with_unused_) skip = register_module("skip", std::make_shared<Linear>(width_, 3));
    fc3 = register_module("fc3", std::make_shared<Linear>(width_, 3));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = fc1->forward(x);
    if (bn) h = bn->forward(h);
    return fc3->forward(relu(fc2->forward(relu(h))));
  }
  std::shared_ptr<Linear> fc1, fc2, fc3, skip;
  std::shared_ptr<nn::BatchNorm1d> bn;

 private:
  int64_t width_;
  bool with_unused_, with_bn_;
};

Tensor mse(const Tensor& out, const Tensor& target) { return nn::functional::mse_loss(out, target); }

std::vector<Device> first(int n) { return cpu_devices(n); }


void expect_replicas_identical(DataParallel& dp, bool grads) {
  auto reference = dp.replica(0).state_dict();
  for (size_t r = 1; r < dp.device_ids().size(); ++r) {
    auto state = dp.replica(r).state_dict();
    for (size_t k = 0; k < state.size(); ++k) {
      EXPECT_TRUE(equal(state[k].second.to(Device::cpu(0)), reference[k].second)) << "replica " << r << " " << state[k].first;
    }
    if (!grads) continue;
    auto p0 = dp.replica(0).parameters(), pr = dp.replica(r).parameters();
    for (size_t k = 0; k < p0.size(); ++k) {
      ASSERT_TRUE(pr[k].grad().defined());
      EXPECT_TRUE(equal(pr[k].grad().to(Device::cpu(0)), p0[k].grad())) << "replica " << r << " grad " << k;
    }
  }
}

TEST(BucketAssignmentTest, PyTorchSizeRule) {
  // float32 parameters of 400, 600, 300, 2000 and 100 bytes.
  std::vector<Tensor> p = {zeros({100}), zeros({150}), zeros({75}), zeros({500}), zeros({25})};
  std::vector<size_t> order = {0, 1, 2, 3, 4};
  using Buckets = std::vector<std::vector<size_t>>;
  // A bucket closes when it reaches the limit, so its last tensor may take it past the limit.
  EXPECT_EQ(compute_bucket_assignment_by_size(p, order, {1000}, true), (Buckets{{0, 1}, {2, 3}, {4}}));
  // The first limit applies to the first bucket only, then the last limit repeats.
  EXPECT_EQ(compute_bucket_assignment_by_size(p, order, {400, 2000}, true), (Buckets{{0}, {1, 2, 3}, {4}}));
  // A tensor larger than the cap is a bucket of its own.
  EXPECT_EQ(compute_bucket_assignment_by_size(p, {3, 4, 2}, {1000}, false), (Buckets{{3}, {4, 2}}));
  // One bucket per dtype; open buckets are appended in order of first appearance; sorting by min index.
  std::vector<Tensor> mixed = {zeros({10}), zeros({10}, DType::Float64), zeros({10})};
  EXPECT_EQ(compute_bucket_assignment_by_size(mixed, {1, 2, 0}, {SIZE_MAX}, false), (Buckets{{1}, {2, 0}}));
  EXPECT_EQ(compute_bucket_assignment_by_size(mixed, {1, 2, 0}, {SIZE_MAX}, true), (Buckets{{2, 0}, {1}}));
}

TEST(DdpTest, OneBucketFirstThenRebuiltFromTheReadyOrder) {
  manual_seed(1);
  // fc weights: 6x64, 64x64, 64x3 floats (1536, 16384, 768 B) + biases; a 16 KiB cap.
  DataParallel dp(std::make_shared<Net>(64), {.device_ids = first(2), .mode = ParallelMode::DDP,
                                              .bucket_cap_mb = 16.0 / 1024});
  ASSERT_EQ(dp.num_buckets(), 0u);  // DDP has no DP reducer
  ASSERT_EQ(dp.ddp_reducer()->num_buckets(), 1u);  // iteration 1: one bucket
  EXPECT_FALSE(dp.ddp_reducer()->buckets_rebuilt());
  Tensor x = randn({8, 6}), y = randn({8, 3});
  dp.forward_backward(x, y, mse);
  EXPECT_EQ(dp.last_step().reduce.transfers, 1);
  dp.zero_grad();
  const int64_t backend_allocations = memory_stats(Device::cpu(1)).num_backend_allocations;
  dp.forward_backward(x, y, mse);  // rebuilt before this backward
  // The rebuilt buckets take the block the first iteration's bucket left in the cache (Note [One block per
  // dtype for the buckets]), and the step's other sizes are the first step's: nothing new from the backend.
  EXPECT_EQ(memory_stats(Device::cpu(1)).num_backend_allocations, backend_allocations);
  const DdpReducer& reducer = *dp.ddp_reducer();
  EXPECT_TRUE(reducer.buckets_rebuilt());
  // Parameters: 0 fc1.w, 1 fc1.b, 2 fc2.w, 3 fc2.b, 4 fc3.w, 5 fc3.b. Gradients become ready last layer first,
  // and with a cap of 16 KiB: {fc3.b, fc3.w, fc2.b, fc2.w} reaches it (fc2.w alone is 16 KiB), then {fc1.*}.
  std::vector<std::vector<size_t>> expected = {{5, 4, 3, 2}, {1, 0}};
  EXPECT_EQ(reducer.buckets(), expected);
  EXPECT_EQ(dp.last_step().buckets, 2);
  // One all-reduce per bucket per step, each launched from a gradient hook (during backward).
  EXPECT_EQ(dp.last_step().reduce.transfers, 2);
  EXPECT_EQ(dp.last_step().buckets_reduced_during_backward, 2);
  // Gradients are views into their bucket (gradient_as_bucket_view), the buckets consecutive slices of one
  // block: bucket 0 holds fc3.b (3), fc3.w (192), fc2.b (64), fc2.w (4096) in that order, bucket 1 fc1.b, fc1.w.
  auto params = dp.replica(1).parameters();
  auto at = [&](size_t p) { return static_cast<const float*>(params[p].grad().data_ptr()); };
  EXPECT_EQ(params[5].grad().storage(), params[0].grad().storage());
  EXPECT_EQ(at(4), at(5) + 3);
  EXPECT_EQ(at(2), at(5) + 3 + 192 + 64);
  EXPECT_EQ(at(1), at(5) + 4355);
  EXPECT_EQ(at(0), at(5) + 4355 + 64);
}

TEST(DdpTest, DefaultCapsArePyTorchs) {
  manual_seed(2);
  // fc2 of a 600-wide net is 1.44 MB: with the default 1 MiB first bucket, fc3's and fc2's bias fit under
  // it and fc2.w closes it; the rest is the second bucket.
  DataParallel dp(std::make_shared<Net>(600), {.device_ids = first(2), .mode = ParallelMode::DDP});
  Tensor x = randn({4, 6}), y = randn({4, 3});
  dp.forward_backward(x, y, mse);
  dp.forward_backward(x, y, mse);
  std::vector<std::vector<size_t>> expected = {{5, 4, 3, 2}, {1, 0}};
  EXPECT_EQ(dp.ddp_reducer()->buckets(), expected);
}

TEST(DdpTest, ReplicasStartAsReplicaZeroAndStructureIsVerified) {
  auto devices = first(3);
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < 3; ++r) {
    manual_seed(100 + r);  // different initial values on every replica
    auto net = std::make_shared<Net>(8, false, true);
    net->to(devices[r]);
    replicas.push_back(net);
  }
  auto expected = replicas[0]->state_dict();
  std::vector<Tensor> expected_values;
  for (auto& [name, t] : expected) expected_values.push_back(t.clone());
  DataParallel dp(replicas, {.device_ids = devices, .mode = ParallelMode::DDP});
  for (int r = 0; r < 3; ++r) {
    auto state = dp.replica(r).state_dict();
    for (size_t k = 0; k < state.size(); ++k) {
      EXPECT_TRUE(equal(state[k].second.to(Device::cpu(0)), expected_values[k])) << r << " " << state[k].first;
    }
  }

  auto wide = std::make_shared<Net>(9);
  wide->to(devices[1]);
  std::string e = error_of([&] {
    DataParallel bad({std::make_shared<Net>(8), wide}, {.device_ids = first(2), .mode = ParallelMode::DDP});
  });
  EXPECT_NE(e.find("replica 1's 'fc1.weight' is [9, 6] float32, replica 0's is [8, 6] float32"), std::string::npos) << e;
  e = error_of([&] {
    DataParallel bad({std::make_shared<Net>(8), std::make_shared<Net>(8)}, {.device_ids = first(2), .mode = ParallelMode::DDP});
  });
  EXPECT_NE(e.find("replica 1's 'fc1.weight' is on cpu:0; expected device_ids[1] = cpu:1"), std::string::npos) << e;
  e = error_of([&] { DataParallel bad(std::vector<std::shared_ptr<nn::Module>>{std::make_shared<Net>(8)}, {.device_ids = first(2)}); });
  EXPECT_NE(e.find("DDP mode's constructor"), std::string::npos) << e;
}

// Single-device gradients of mean-reduced losses over (a slice of) the batch.
std::vector<Tensor> reference_grads(const nn::Module& model, const Tensor& x, const Tensor& y) {
  auto copy = nn::clone_module(model, Device::cpu(0));
  mse(copy->forward(x), y).backward();
  std::vector<Tensor> grads;
  for (const Tensor& p : copy->parameters()) grads.push_back(p.grad());
  return grads;
}

TEST(DdpTest, EvenShardsGiveTheFullBatchGradientOnEveryReplica) {
  for (int n : {2, 3, 4}) {
    manual_seed(10 + n);
    auto net = std::make_shared<Net>();
    auto expected = reference_grads(*net, randn({1, 6}), randn({1, 3}));  // shape only; recomputed below
    Tensor x = randn({12, 6}), y = randn({12, 3});
    expected = reference_grads(*net, x, y);
    DataParallel dp(net, {.device_ids = first(n), .mode = ParallelMode::DDP});
    double loss = dp.forward_backward(x, y, mse);
    {
      NoGradGuard no_grad;
      EXPECT_NEAR(loss, mse(nn::clone_module(*net, Device::cpu(0))->forward(x), y).item(), 1e-5);
    }
    for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
      auto params = dp.replica(r).parameters();
      for (size_t k = 0; k < params.size(); ++k) {
        EXPECT_LT(max_relative_diff(params[k].grad(), expected[k]), 1e-5) << "n=" << n << " replica " << r << " param " << k;
      }
    }
    expect_replicas_identical(dp, true);
  }
}

// PyTorch's DDP averages the replicas' means, which for uneven shards is not the batch's mean gradient; dpe
// weighs each replica by its share of the batch, so both modes give the full batch's mean.
TEST(DdpTest, UnevenShardsGiveTheFullBatchMeanLikeDp) {
  manual_seed(21);
  auto net = std::make_shared<Net>();
  Tensor x = randn({5, 6}), y = randn({5, 3});  // shards of 3 and 2
  auto full = reference_grads(*net, x, y);
  auto first_shard = reference_grads(*net, x.narrow(0, 0, 3), y.narrow(0, 0, 3));
  auto second_shard = reference_grads(*net, x.narrow(0, 3, 2), y.narrow(0, 3, 2));

  DataParallel ddp(nn::clone_module(*net, Device::cpu(0)), {.device_ids = first(2), .mode = ParallelMode::DDP});
  ddp.forward_backward(x, y, mse);
  DataParallel dp(nn::clone_module(*net, Device::cpu(0)), {.device_ids = first(2)});
  dp.forward_backward(x, y, mse);
  auto ddp_params = ddp.replica(1).parameters();
  auto dp_params = dp.module().parameters();
  for (size_t k = 0; k < full.size(); ++k) {
    EXPECT_LT(max_relative_diff(ddp_params[k].grad(), full[k]), 1e-5) << k;
    EXPECT_LT(max_relative_diff(dp_params[k].grad(), full[k]), 1e-5) << k;
    Tensor mean_of_means = (first_shard[k] + second_shard[k]) * 0.5;
    EXPECT_GT(max_relative_diff(mean_of_means, full[k]), 1e-3) << k;  // PyTorch's answer would differ
  }
}

// A batch smaller than the device count (3 samples on 4 devices: chunks 1, 1, 1 and none): the empty replica
// contributes zeros with weight 0 and still takes part in every all-reduce, so training is one device's on
// the full batch and every replica stays identical (PyTorch's DDP cannot run uneven inputs without its Join).
TEST(DdpTest, DevicesWithoutSamplesTakePartAndTrainingIsOneDevices) {
  for (bool find_unused : {false, true}) {
    manual_seed(23);
    auto net = std::make_shared<Net>();
    auto single = nn::clone_module(*net, Device::cpu(0));
    auto single_optimizer = std::make_unique<optim::SGD>(single->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    DataParallel ddp(nn::clone_module(*net, Device::cpu(0)),
                     {.device_ids = first(4), .mode = ParallelMode::DDP, .find_unused_parameters = find_unused});
    ddp.set_optimizer([](const std::vector<Tensor>& p) {
      return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    });
    for (int step = 0; step < 4; ++step) {
      Tensor x = randn({3, 6}), y = randn({3, 3});
      single_optimizer->zero_grad();
      mse(single->forward(x), y).backward();
      single_optimizer->step();
      const double loss = ddp.train_step(x, y, mse);
      EXPECT_TRUE(std::isfinite(loss));
      EXPECT_EQ(ddp.last_step().chunk_sizes, (std::vector<int64_t>{1, 1, 1, 0}));
      EXPECT_EQ(ddp.last_step().used_devices.size(), 3u);
    }
    expect_replicas_identical(ddp, true);
    auto want = single->parameters(), got = ddp.replica(3).parameters();
    for (size_t k = 0; k < want.size(); ++k) EXPECT_LT(max_relative_diff(got[k], want[k]), 1e-5) << find_unused << " " << k;
  }
  // SyncBatchNorm needs a sample on every replica: refused, saying what to do.
  auto with_sync_bn = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<Linear>(6, 8), std::make_shared<nn::SyncBatchNorm>(8), std::make_shared<Linear>(8, 3)});
  DataParallel sync(with_sync_bn, {.device_ids = first(4), .mode = ParallelMode::DDP});
  EXPECT_NE(error_of([&] { sync.forward_backward(randn({3, 6}), randn({3, 3}), mse); })
                .find("a batch of 3 leaves 1 of 4 devices without a sample, and the model's SyncBatchNorm layers need "
                      "one on every replica; use a batch of at least 4"),
            std::string::npos);
  DataParallel plain(std::make_shared<Net>(), {.device_ids = first(2), .mode = ParallelMode::DDP});
  EXPECT_NE(error_of([&] { plain.forward_backward(randn({0, 6}), randn({0, 3}), mse); }).find("the batch is empty"),
            std::string::npos);
}

// K steps of the same data in single-device, DP and DDP mode with the given optimizer.
void check_lock_step(const OptimizerFactory& make_optimizer) {
  manual_seed(31);
  auto net = std::make_shared<Net>();
  auto single = nn::clone_module(*net, Device::cpu(0));
  auto single_optimizer = make_optimizer(single->parameters());
  DataParallel dp(nn::clone_module(*net, Device::cpu(0)), {.device_ids = first(2)});
  DataParallel ddp(nn::clone_module(*net, Device::cpu(0)), {.device_ids = first(3), .mode = ParallelMode::DDP});
  dp.set_optimizer(make_optimizer);
  ddp.set_optimizer(make_optimizer);
  for (int step = 0; step < 5; ++step) {
    Tensor x = randn({12, 6}), y = randn({12, 3});
    single_optimizer->zero_grad();
    mse(single->forward(x), y).backward();
    single_optimizer->step();
    dp.train_step(x, y, mse);
    ddp.train_step(x, y, mse);
  }
  expect_replicas_identical(ddp, false);
  auto expected = single->parameters();
  auto dp_params = dp.module().parameters(), ddp_params = ddp.replica(2).parameters();
  for (size_t k = 0; k < expected.size(); ++k) {
    EXPECT_LT(max_relative_diff(dp_params[k], expected[k]), 1e-5) << k;
    EXPECT_LT(max_relative_diff(ddp_params[k], dp_params[k]), 1e-5) << k;
  }
}

TEST(DdpTest, SgdMomentumStepsKeepReplicasIdenticalAndMatchDp) {
  check_lock_step([](const std::vector<Tensor>& p) {
    return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  });
}

TEST(DdpTest, AdamWStepsKeepReplicasIdenticalAndMatchDp) {
  check_lock_step([](const std::vector<Tensor>& p) {
    return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = 1e-2});
  });
}

TEST(DdpTest, NoSyncAccumulatesLocallyWithoutCollectives) {
  manual_seed(41);
  auto net = std::make_shared<Net>();
  const int n = 2, micro = 3;
  std::vector<Tensor> xs, ys;
  for (int k = 0; k <= micro; ++k) {
    xs.push_back(randn({4, 6}));
    ys.push_back(randn({4, 3}));
  }
  // Expected: the average over replicas of each replica's summed local gradients.
  std::vector<Tensor> expected;
  for (int r = 0; r < n; ++r) {
    auto copy = nn::clone_module(*net, Device::cpu(0));
    for (int k = 0; k <= micro; ++k) mse(copy->forward(xs[k].narrow(0, 2 * r, 2)), ys[k].narrow(0, 2 * r, 2)).backward();
    auto params = copy->parameters();
    for (size_t p = 0; p < params.size(); ++p) {
      Tensor half = params[p].grad() * 0.5;
      if (r == 0) expected.push_back(half);
      else expected[p] = expected[p] + half;
    }
  }
  DataParallel ddp(net, {.device_ids = first(n), .mode = ParallelMode::DDP});
  ProcessGroup& group = *ddp.process_group();
  {
    auto guard = ddp.no_sync();
    int64_t before = group.total_calls();
    for (int k = 0; k < micro; ++k) ddp.forward_backward(xs[k], ys[k], mse);
    EXPECT_EQ(group.total_calls(), before);  // not one collective inside no_sync
    EXPECT_NE(error_of([&] { ddp.train_step(xs[0], ys[0], mse); }).find("inside no_sync"), std::string::npos);
  }
  ddp.forward_backward(xs[micro], ys[micro], mse);
  for (int r = 0; r < n; ++r) {
    auto params = ddp.replica(r).parameters();
    for (size_t p = 0; p < params.size(); ++p) EXPECT_LT(max_relative_diff(params[p].grad(), expected[p]), 1e-5) << r << " " << p;
  }
}

// Note [One replica in all] (ddp_reducer.cc): DDP on one device leaves the gradients where the backward put
// them: the same bits as a plain backward, nothing reduced, and no_sync accumulation, unused parameters and
// the unused-parameter error as with several devices.
TEST(DdpTest, OneReplicaInAllKeepsTheBackwardsGradients) {
  manual_seed(50);
  std::vector<Tensor> xs, ys;
  for (int k = 0; k < 3; ++k) {
    xs.push_back(randn({4, 6}));
    ys.push_back(randn({4, 3}));
  }
  auto net = std::make_shared<Net>();
  auto plain = nn::clone_module(*net, Device::cpu(0));
  DataParallel ddp(net, {.device_ids = first(1), .mode = ParallelMode::DDP});
  for (int step = 0; step < 2; ++step) {
    plain->zero_grad();
    mse(plain->forward(xs[step]), ys[step]).backward();
    ddp.zero_grad();
    ddp.forward_backward(xs[step], ys[step], mse);
    auto got = ddp.replica(0).parameters(), want = plain->parameters();
    for (size_t p = 0; p < got.size(); ++p) EXPECT_TRUE(equal(got[p].grad(), want[p].grad())) << step << " " << p;
    EXPECT_EQ(ddp.last_step().reduce.bytes, 0);
  }
  // Accumulated: two micro-batches under no_sync, then a synchronised third, as a plain backward sums them.
  plain->zero_grad();
  ddp.zero_grad();
  for (int k = 0; k < 3; ++k) mse(plain->forward(xs[k]), ys[k]).backward();
  {
    auto guard = ddp.no_sync();
    for (int k = 0; k < 2; ++k) ddp.forward_backward(xs[k], ys[k], mse);
  }
  ddp.forward_backward(xs[2], ys[2], mse);
  auto got = ddp.replica(0).parameters(), want = plain->parameters();
  for (size_t p = 0; p < got.size(); ++p) EXPECT_LT(max_relative_diff(got[p].grad(), want[p].grad()), 1e-6) << p;

  Tensor x = randn({4, 6}), y = randn({4, 3});
  DataParallel strict(std::make_shared<Net>(8, true), {.device_ids = first(1), .mode = ParallelMode::DDP});
  EXPECT_NE(error_of([&] { strict.forward_backward(x, y, mse); }).find("'skip.weight', 'skip.bias'"),
            std::string::npos);
  DataParallel lenient(std::make_shared<Net>(8, true),
                       {.device_ids = first(1), .mode = ParallelMode::DDP, .find_unused_parameters = true});
  lenient.forward_backward(x, y, mse);
  for (const auto& [name, param] : lenient.replica(0).named_parameters()) {
    EXPECT_EQ(param.grad().defined(), !name.starts_with("skip.")) << name;
  }
}

// ... and holds no buckets: what it keeps after its steps is the gradients, not a second copy of them.
TEST(DdpTest, OneReplicaInAllHoldsNoBuckets) {
  manual_seed(52);
  Tensor x = randn({4, 6}), y = randn({4, 3});
  auto net = std::make_shared<Net>(256);  // ~67k parameters: the gradients outweigh everything else here
  int64_t gradient_bytes = 0;
  for (const Tensor& p : net->parameters()) gradient_bytes += p.nbytes();
  const int64_t before = memory_stats(Device::cpu(0)).allocated_bytes;
  DataParallel ddp(net, {.device_ids = first(1), .mode = ParallelMode::DDP});
  for (int step = 0; step < 3; ++step) {  // past the buckets' rebuild after the first
    ddp.zero_grad();
    ddp.forward_backward(x, y, mse);
  }
  const int64_t held = memory_stats(Device::cpu(0)).allocated_bytes - before;
  EXPECT_GE(held, gradient_bytes);
  EXPECT_LT(held, gradient_bytes * 3 / 2) << "gradients " << gradient_bytes;
}

TEST(DdpTest, UnusedParametersNeedFindUnusedParameters) {
  manual_seed(51);
  Tensor x = randn({4, 6}), y = randn({4, 3});
  DataParallel strict(std::make_shared<Net>(8, true), {.device_ids = first(2), .mode = ParallelMode::DDP});
  std::string e = error_of([&] { strict.forward_backward(x, y, mse); });
  EXPECT_NE(e.find("parameters that received no gradient: 'skip.weight', 'skip.bias'"), std::string::npos) << e;
  EXPECT_NE(e.find("find_unused_parameters = true"), std::string::npos) << e;

  auto net = std::make_shared<Net>(8, true);
  auto expected = reference_grads(*net, x, y);
  DataParallel ddp(net, {.device_ids = first(2), .mode = ParallelMode::DDP, .find_unused_parameters = true});
  for (int step = 0; step < 2; ++step) {
    ddp.zero_grad();
    ddp.forward_backward(x, y, mse);
    for (int r = 0; r < 2; ++r) {
      auto named = ddp.replica(r).named_parameters();
      for (size_t k = 0; k < named.size(); ++k) {
        const Tensor& g = named[k].second.grad();
        if (named[k].first.starts_with("skip.")) {
          EXPECT_FALSE(g.defined()) << named[k].first;  // unused everywhere: untouched
        } else {
          EXPECT_LT(max_relative_diff(g, expected[k]), 1e-5) << named[k].first;
        }
      }
    }
  }
}

TEST(DdpTest, BuffersAreBroadcastFromReplicaZeroBeforeEachForward) {
  for (bool broadcast : {true, false}) {
    manual_seed(61);
    DataParallel ddp(std::make_shared<Net>(8, false, true),
                     {.device_ids = first(2), .mode = ParallelMode::DDP, .broadcast_buffers = broadcast});
    auto* bn = dynamic_cast<Net&>(ddp.replica(1)).bn.get();
    bn->num_batches_tracked.fill_(100);
    ddp.forward_backward(randn({4, 6}), randn({4, 3}), mse);
    EXPECT_EQ(bn->num_batches_tracked.item(), broadcast ? 1.0 : 101.0);
  }
}

// SyncBatchNorm in DDP mode: the engine gives every replica's SyncBatchNorm its rank in the group, so with
// even shards the gradients and running statistics equal a single device's BatchNorm over the whole batch.
TEST(DdpTest, SyncBatchNormMatchesSingleDeviceBatchNorm) {
  manual_seed(91);
  auto make = [] {
    return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<Linear>(6, 8), std::make_shared<nn::BatchNorm1d>(8), std::make_shared<nn::ReLU>(),
        std::make_shared<Linear>(8, 3)});
  };
  auto model = make();
  auto reference = nn::clone_module(*model, Device::cpu(0));
  Tensor x = randn({12, 6}), y = randn({12, 3});
  mse(reference->forward(x), y).backward();
  DataParallel ddp(nn::convert_sync_batchnorm(model), {.device_ids = first(3), .mode = ParallelMode::DDP});
  ProcessGroup& group = *ddp.process_group();
  group.reset_counters();
  ddp.forward_backward(x, y, mse);
  EXPECT_EQ(group.calls(Collective::AllGather), 1);  // SyncBatchNorm's statistics, once per forward
  auto expected = reference->state_dict();
  auto expected_params = reference->parameters();
  for (size_t r = 0; r < 3; ++r) {
    auto state = ddp.replica(r).state_dict();
    for (size_t k = 0; k < state.size(); ++k) {
      if (state[k].first.find("running_") != std::string::npos) {
        EXPECT_LT(max_relative_diff(state[k].second, expected[k].second), 1e-5) << r << " " << state[k].first;
      }
    }
    auto params = ddp.replica(r).parameters();
    for (size_t k = 0; k < params.size(); ++k) {
      // Absolute tolerance too: the first layer's bias gradient is zero up to rounding (BatchNorm follows).
      EXPECT_TRUE(allclose(params[k].grad(), expected_params[k].grad(), 1e-4, 1e-6)) << r << " param " << k;
    }
  }
}

// Two branches whose backward order follows their forward order, which `flip` reverses: replicas with
// different flips produce their gradients in different orders.
class TwoBranches : public Cloneable<TwoBranches> {
 public:
  TwoBranches() : Cloneable("TwoBranches") { reset(); }
  void reset() override {
    left = register_module("left", std::make_shared<Linear>(6, 3));
    right = register_module("right", std::make_shared<Linear>(6, 3));
  }
  Tensor forward(const Tensor& x) override {
    if (flip) {
      Tensor r = right->forward(x);
      return left->forward(x) + r;
    }
    Tensor l = left->forward(x);
    return l + right->forward(x);
  }
  std::shared_ptr<Linear> left, right;
  bool flip = false;
};

TEST(DdpTest, LaunchOrderIsTheBucketOrderWhateverOrderGradientsArriveIn) {
  manual_seed(95);
  auto net = std::make_shared<TwoBranches>();
  Tensor x = randn({8, 6}), y = randn({8, 3});
  auto expected = reference_grads(*net, x, y);
  // A tiny cap: every parameter is a bucket of its own after the rebuild.
  DataParallel ddp(net, {.device_ids = first(2), .mode = ParallelMode::DDP, .bucket_cap_mb = 1e-6,
                         .timeout = std::chrono::seconds(20)});
  dynamic_cast<TwoBranches&>(ddp.replica(1)).flip = true;
  for (int step = 0; step < 3; ++step) {  // the first iteration, the rebuild, and after it
    ddp.zero_grad();
    ddp.forward_backward(x, y, mse);
    for (size_t r = 0; r < 2; ++r) {
      auto params = ddp.replica(r).parameters();
      for (size_t k = 0; k < params.size(); ++k) {
        EXPECT_LT(max_relative_diff(params[k].grad(), expected[k]), 1e-5) << "step " << step << " replica " << r;
      }
    }
  }
  EXPECT_EQ(ddp.ddp_reducer()->num_buckets(), 4u);
}

TEST(DdpTest, ErrorsNameTheProblem) {
  DataParallel ddp(std::make_shared<Net>(), {.device_ids = first(3), .mode = ParallelMode::DDP});
  EXPECT_NE(error_of([&] { ddp.forward(randn({3, 6})); }).find("forward() with gradients enabled"), std::string::npos);
  {
    NoGradGuard no_grad;
    EXPECT_EQ(ddp.forward(randn({5, 6})).shape(), (Shape{5, 3}));  // evaluation works
  }
  EXPECT_EQ(error_of([&] { ddp.forward_backward(randn({2, 6}), randn({2, 3}), mse); }), "(no error)");  // a device without samples takes part
  EXPECT_NE(error_of([&] { ddp.forward_backward(randn({6, 6}), randn({5, 3}), mse); }).find("does not match the input's batch of 6"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ddp.optimizer_step(); }).find("call set_optimizer first"), std::string::npos);
  // A replica that fails does not leave its partners waiting for the timeout, and the engine stays usable.
  auto start = std::chrono::steady_clock::now();
  std::string e = error_of([&] {
    ddp.forward_backward(randn({6, 6}), randn({6, 3}), [](const Tensor& out, const Tensor& target) {
      DPE_CHECK(out.device() != Device::cpu(1), "loss refused on cpu:1");
      return mse(out, target);
    });
  });
  EXPECT_NE(e.find("loss refused on cpu:1"), std::string::npos) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  ddp.zero_grad();
  ddp.forward_backward(randn({6, 6}), randn({6, 3}), mse);
  expect_replicas_identical(ddp, true);
}

// Fails on one device, in one phase of the DDP step: forward, the loss or backward.
enum class Phase { Forward, Loss, Backward };

class FailsOnOneDevice : public Cloneable<FailsOnOneDevice> {
 public:
  FailsOnOneDevice(Device where = Device::cpu(0), Phase phase = Phase::Forward)
      : Cloneable("FailsOnOneDevice"), where_(where), phase_(phase) {
    reset();
  }
  void reset() override { fc = register_module("fc", std::make_shared<Linear>(6, 3)); }
  Tensor forward(const Tensor& x) override {
    Tensor y = fc->forward(x);
    if (x.device() != where_ || !*armed) return y;
    DPE_CHECK(phase_ != Phase::Forward, "forward refused on ", where_);
    if (phase_ == Phase::Backward) {
      Tensor out = y.detach();
      autograd::record(out, {y}, "RefuseBackward", [where = where_](const Tensor&) -> std::vector<Tensor> {
        DPE_CHECK(false, "backward refused on ", where);
      });
      return out;
    }
    return y;
  }
  std::shared_ptr<Linear> fc;
  std::shared_ptr<std::atomic<bool>> armed = std::make_shared<std::atomic<bool>>(true);  // shared by clones

 private:
  Device where_;
  Phase phase_;
};

// Regression: the caller got a partner's secondary "process group is aborted" error
// (replica 0's) instead of the failed replica's own.
TEST(DdpTest, AFailedReplicaIsReportedAsItselfNotAsItsPartners) {
  for (int failing : {1, 2}) {
    for (Phase phase : {Phase::Forward, Phase::Loss, Phase::Backward}) {
      const Device where = Device::cpu(failing);
      const std::string expected = phase == Phase::Forward ? "forward refused on " + where.str()
                                   : phase == Phase::Loss  ? "loss refused on " + where.str()
                                                           : "backward refused on " + where.str();
      SCOPED_TRACE(expected);
      auto net = std::make_shared<FailsOnOneDevice>(where, phase);
      DataParallel ddp(net, {.device_ids = first(3), .mode = ParallelMode::DDP});
      LossFn loss = [&](const Tensor& out, const Tensor& target) {
        DPE_CHECK(phase != Phase::Loss || out.device() != where, "loss refused on ", where);
        return mse(out, target);
      };
      try {
        ddp.forward_backward(randn({6, 6}), randn({6, 3}), loss);
        ADD_FAILURE() << "no error";
      } catch (const ReplicaError& e) {
        const std::string what = e.what();
        EXPECT_EQ(e.replica(), failing) << what;
        EXPECT_EQ(e.device(), where) << what;
        EXPECT_EQ(what.rfind("replica " + std::to_string(failing) + " on " + where.str() + ": " + expected, 0), 0u) << what;
        EXPECT_EQ(e.later_failures().size(), 2u);  // both partners waited for it in an all-reduce
        for (const auto& later : e.later_failures()) {  // the partners' consequences, as context
          EXPECT_NE(later.replica, failing);
          EXPECT_NE(later.message.find("replica " + std::to_string(failing) + " on " + where.str() + " failed: " + expected),
                    std::string::npos) << later.message;
        }
      }
      *net->armed = false;
      ddp.zero_grad();  // the engine stays usable
      ddp.forward_backward(randn({6, 6}), randn({6, 3}), mse);
      expect_replicas_identical(ddp, true);
    }
  }
}

// An error after which every allocation on the thread that threw it fails while the error lives: out of memory
// there, as under `ulimit -v`, so that the failure handler runs out of memory too.
struct OutOfMemoryOnThisThread : std::runtime_error {
  OutOfMemoryOnThisThread()
      : std::runtime_error("out of memory here (test)"),
        failing(std::make_shared<testing::FailingNew>(testing::FailingNew::kThisThread)) {}
  std::shared_ptr<testing::FailingNew> failing;  // shared: copies of the exception keep it failing
};

class RunsOutOfMemoryOnCpu0 : public Cloneable<RunsOutOfMemoryOnCpu0> {
 public:
  RunsOutOfMemoryOnCpu0() : Cloneable("RunsOutOfMemoryOnCpu0") { reset(); }
  void reset() override { fc = register_module("fc", std::make_shared<Linear>(6, 3)); }
  Tensor forward(const Tensor& x) override {
    if (x.device() == Device::cpu(0) && *armed) throw OutOfMemoryOnThisThread();
    return fc->forward(x);
  }
  std::shared_ptr<Linear> fc;
  std::shared_ptr<std::atomic<bool>> armed = std::make_shared<std::atomic<bool>>(true);  // shared by clones
};

// Out of memory on the failed replica's thread, its failure handler cannot build or keep the abort's reason; the
// partner must be woken all the same, not wait in the all-reduce for the group's timeout (dpe_errors_test's rare
// hang under `ulimit -v`; the unit regression, an abort whose reason cannot be copied, is process_group_test's
// AbortWakesWaitingMembersEvenWhenItCannotKeepItsReason), and the engine stays usable.
TEST(DdpTest, AReplicaOutOfMemoryStillWakesItsPartners) {
  auto net = std::make_shared<RunsOutOfMemoryOnCpu0>();
  DataParallel ddp(net, {.device_ids = first(2), .mode = ParallelMode::DDP, .timeout = std::chrono::seconds(20)});
  try {
    ddp.forward_backward(randn({6, 6}), randn({6, 3}), mse);
    ADD_FAILURE() << "no error";
  } catch (const ReplicaError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.replica(), 0) << what;
    EXPECT_NE(what.find("out of memory here (test)"), std::string::npos) << what;
    ASSERT_EQ(e.later_failures().size(), 1u) << what;  // the partner, woken by the abort
    EXPECT_EQ(e.later_failures()[0].message.find("timed out"), std::string::npos) << e.later_failures()[0].message;
  }
  *net->armed = false;
  ddp.zero_grad();  // the engine stays usable
  ddp.forward_backward(randn({6, 6}), randn({6, 3}), mse);
  expect_replicas_identical(ddp, true);
}

TEST(DdpTest, StepReportHasEveryPhase) {
  manual_seed(71);
  DataParallel ddp(std::make_shared<Net>(), {.device_ids = first(2), .mode = ParallelMode::DDP});
  ddp.set_optimizer([](const std::vector<Tensor>& p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions{}); });
  double loss = ddp.train_step(randn({8, 6}), randn({8, 3}), mse);
  const StepReport& report = ddp.last_step();
  EXPECT_EQ(report.mode, ParallelMode::DDP);
  EXPECT_EQ(report.loss, loss);
  EXPECT_EQ(report.chunk_sizes, (std::vector<int64_t>{4, 4}));
  EXPECT_GT(report.forward_ms, 0);
  EXPECT_GT(report.backward_ms, 0);
  EXPECT_GT(report.optimizer_ms, 0);
  EXPECT_EQ(report.memory.size(), 2u);
  int64_t params_bytes = 0;
  for (const Tensor& p : ddp.parameters()) params_bytes += static_cast<int64_t>(p.nbytes());
  EXPECT_EQ(report.reduce.bytes, 2 * params_bytes);
}

#if DPE_WITH_CUDA
// Three logical devices on GPU 0 (peer-copy collectives): the same gradients as the CPU reference, and
// replicas that stay identical through SGD-momentum steps.
// Maps three logical devices onto GPU 0 (once: the mapping freezes on first use).
void map_three_logical_devices_on_gpu0() {
  static bool mapped = [] {
    set_cuda_logical_devices({0, 0, 0});
    return true;
  }();
  (void)mapped;
}

TEST(DdpCudaTest, LogicalDevicesOnOneGpu) {
  if (cuda::physical_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::unavailable_reason();
  map_three_logical_devices_on_gpu0();
  manual_seed(81);
  auto net = std::make_shared<Net>();
  Tensor x = randn({12, 6}), y = randn({12, 3});
  auto expected = reference_grads(*net, x, y);
  std::vector<Device> gpus = {Device::cuda(0), Device::cuda(1), Device::cuda(2)};
  DataParallel ddp(nn::clone_module(*net, gpus[0]), {.device_ids = gpus, .mode = ParallelMode::DDP});
  EXPECT_EQ(ddp.process_group()->backend(), CollectiveBackend::PeerCopy);
  ddp.forward_backward(x, y, mse);
  for (size_t r = 0; r < gpus.size(); ++r) {
    auto params = ddp.replica(r).parameters();
    for (size_t k = 0; k < params.size(); ++k) {
      EXPECT_LT(max_relative_diff(params[k].grad().to(Device::cpu(0)), expected[k]), 1e-4) << r << " " << k;
    }
  }
  expect_replicas_identical(ddp, true);
  ddp.set_optimizer([](const std::vector<Tensor>& p) {
    return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  });
  for (int step = 0; step < 3; ++step) ddp.train_step(randn({12, 6}), randn({12, 3}), mse);
  expect_replicas_identical(ddp, false);
}

// Pinned batches take the asynchronous path (scatter / shard copies only enqueued, pinned blocks recycled
// between steps once their copies ran): step for step the same losses and parameters as pageable batches.
TEST(DdpCudaTest, PinnedBatchesTrainExactlyLikePageableOnes) {
  if (cuda::physical_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::unavailable_reason();
  map_three_logical_devices_on_gpu0();
  std::vector<Device> gpus = {Device::cuda(0), Device::cuda(1)};
  auto make_sgd = [](const std::vector<Tensor>& p) {
    return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  };
  for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
    manual_seed(83);
    auto net = std::make_shared<Net>();
    DataParallel pinned(nn::clone_module(*net, gpus[0]), {.device_ids = gpus, .mode = mode});
    DataParallel pageable(nn::clone_module(*net, gpus[0]), {.device_ids = gpus, .mode = mode});
    pinned.set_optimizer(make_sgd);
    pageable.set_optimizer(make_sgd);
    for (int step = 0; step < 4; ++step) {
      Tensor x = randn({12, 6}), y = randn({12, 3});
      double a = pinned.train_step(x.pin_memory(), y.pin_memory(), mse);
      double b = pageable.train_step(x, y, mse);
      EXPECT_NEAR(a, b, 1e-6 * std::abs(b)) << static_cast<int>(mode) << " step " << step;
    }
    auto got = pinned.module().parameters(), want = pageable.module().parameters();
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_LT(max_relative_diff(got[k].to(Device::cpu(0)), want[k].to(Device::cpu(0))), 1e-6) << k;
    }
  }
}
#endif

}  // namespace
}  // namespace dpe
