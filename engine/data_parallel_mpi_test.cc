// DataParallel across processes (backend 'mpi'), DDP and DP mode, run as both processes of `mpirun -np 2`
// (collectives/mpirun_test.sh) with four CPU devices each: 2 processes x 2 devices must train like 1 process x 4
// devices on the same global batches, and failures and mismatches must be
// reported alike on both.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "collectives/process_group.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "layers/activation.h"
#include "layers/batchnorm.h"
#include "layers/sync_batchnorm.h"
#include "layers/containers.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "scatter_gather/chunking.h"

namespace dpe {
namespace {

int process_rank() { return std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")); }
int process_count() { return std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")); }

std::shared_ptr<nn::Module> make_model(uint64_t seed, int64_t hidden = 32, bool extra_layer = false) {
  manual_seed(seed);
  std::vector<std::shared_ptr<nn::Module>> layers = {std::make_shared<nn::Linear>(12, hidden),
                                                     std::make_shared<nn::ReLU>(),
                                                     std::make_shared<nn::Linear>(hidden, 5)};
  if (extra_layer) layers.push_back(std::make_shared<nn::Linear>(5, 5));
  return std::make_shared<nn::Sequential>(layers);
}

Tensor mse(const Tensor& out, const Tensor& target) { return nn::functional::mse_loss(out, target); }

std::vector<Device> cpus(int first, int count) {
  std::vector<Device> devices;
  for (int d = first; d < first + count; ++d) devices.push_back(Device::cpu(d));
  return devices;
}

// 5 global batches of `batch` rows (inputs (batch, 12), targets (batch, 5)), the same in every process.
std::vector<std::pair<Tensor, Tensor>> global_batches(uint64_t seed, int64_t batch) {
  manual_seed(seed);
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int step = 0; step < 5; ++step) batches.emplace_back(randn({batch, 12}), randn({batch, 5}));
  return batches;
}

// The losses train_step returned across processes are the global batch's, as one process's with every device.
void expect_same_losses(const std::vector<double>& across, const std::vector<double>& one) {
  ASSERT_EQ(across.size(), one.size());
  for (size_t step = 0; step < one.size(); ++step) {
    EXPECT_NEAR(across[step], one[step], 1e-6 * std::abs(one[step])) << "step " << step;
  }
}

// Every parameter within 1e-6 of one process's; `what` says whose (errors).
void expect_parameters_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) EXPECT_LE(max_abs_diff(got[k], want[k]), 1e-6) << what << " parameter " << k;
}

// Trains `ddp` on the global batches, of which this process takes rows [offset, offset + rows); returns the
// losses train_step reported.
std::vector<double> train(DataParallel& ddp, const std::vector<std::pair<Tensor, Tensor>>& batches, int64_t offset,
                          int64_t rows) {
  ddp.set_optimizer([](const std::vector<Tensor>& params) {
    return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 1e-2});
  });
  std::vector<double> losses;
  for (const auto& [x, y] : batches) losses.push_back(ddp.train_step(x.narrow(0, offset, rows), y.narrow(0, offset, rows), mse));
  return losses;
}

TEST(DdpAcrossProcesses, TwoProcessesOfTwoDevicesTrainLikeOneProcessOfFour) {
  const int p = process_rank(), processes = process_count();
  const int64_t batch = 8 * processes;  // 4 rows per replica in both runs
  const auto batches = global_batches(7, batch);

  // Across processes: process p's replicas start from a model of its own seed; construction broadcasts
  // global rank 0's parameters to every replica of every process.
  DataParallel across(make_model(100 + p), {.device_ids = cpus(0, 2), .mode = ParallelMode::DDP,
                                            .backend = CollectiveBackend::Mpi});
  ASSERT_EQ(across.process_group()->world_size(), 2 * processes);
  const std::vector<double> across_losses = train(across, batches, batch / processes * p, batch / processes);

  DataParallel one(make_model(100), {.device_ids = cpus(0, 2 * processes), .mode = ParallelMode::DDP});
  const std::vector<double> one_losses = train(one, batches, 0, batch);
  expect_same_losses(across_losses, one_losses);

  const std::vector<Tensor> want = one.module().parameters();
  for (size_t r = 0; r < 2; ++r) {
    expect_parameters_close(across.replica(r).parameters(), want,
                            "process " + std::to_string(p) + " replica " + std::to_string(r));
  }
}

// SyncBatchNorm across processes: its statistics are gathered from every replica of every process. (No bias
// before the BatchNorm: its gradient is zero up to rounding, and AdamW would turn the rounding into steps.)
TEST(DdpAcrossProcesses, SyncBatchNormTrainsLikeOneProcess) {
  const int p = process_rank(), processes = process_count();
  const int64_t batch = 8 * processes;
  auto make = [](uint64_t seed) {
    manual_seed(seed);
    return nn::convert_sync_batchnorm(std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(12, 16, /*bias=*/false), std::make_shared<nn::BatchNorm1d>(16),
        std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(16, 5)}));
  };
  const auto batches = global_batches(8, batch);
  DataParallel across(make(200 + p), {.device_ids = cpus(0, 2), .mode = ParallelMode::DDP,
                                      .backend = CollectiveBackend::Mpi});
  const std::vector<double> across_losses = train(across, batches, batch / processes * p, batch / processes);
  DataParallel one(make(200), {.device_ids = cpus(0, 2 * processes), .mode = ParallelMode::DDP});
  const std::vector<double> one_losses = train(one, batches, 0, batch);
  expect_same_losses(across_losses, one_losses);
  const nn::StateDict want = one.module().state_dict(), got = across.module().state_dict();
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    if (!is_floating_point(got[k].second.dtype())) continue;  // num_batches_tracked
    EXPECT_LE(max_abs_diff(got[k].second, want[k].second), 1e-5) << "process " << p << " " << got[k].first;
  }
}

// An uneven global batch (13 rows over 4 replicas: shards of 4, 4, 4 and 1, as torch.chunk cuts them):
// process p takes the rows of its replicas' shards. Every replica's gradient weighs its share of the global
// batch, in one process as across processes, so both train like one device on the full batch.
void expect_uneven_batch_trains_like_one_device(ParallelMode mode) {
  const int p = process_rank(), processes = process_count();
  const int64_t batch = 6 * processes + 1;
  const std::vector<int64_t> shards = compute_chunk_sizes(batch, 2 * processes);
  int64_t offset = 0;
  for (int k = 0; k < 2 * p; ++k) offset += shards[k];
  const int64_t rows = shards[2 * p] + shards[2 * p + 1];
  const auto batches = global_batches(10, batch);
  DataParallel across(make_model(400 + p), {.device_ids = cpus(0, 2), .mode = mode, .backend = CollectiveBackend::Mpi});
  const std::vector<double> across_losses = train(across, batches, offset, rows);
  DataParallel one(make_model(400), {.device_ids = cpus(0, 1), .mode = mode});
  const std::vector<double> one_losses = train(one, batches, 0, batch);
  expect_same_losses(across_losses, one_losses);
  expect_parameters_close(across.module().parameters(), one.module().parameters(), "process " + std::to_string(p));
}

TEST(DdpAcrossProcesses, AnUnevenGlobalBatchTrainsLikeOneDevice) { expect_uneven_batch_trains_like_one_device(ParallelMode::DDP); }

TEST(DpAcrossProcesses, AnUnevenGlobalBatchTrainsLikeOneDevice) { expect_uneven_batch_trains_like_one_device(ParallelMode::DP); }

// Its `skip` layer is in no replica's graph: DDP needs find_unused_parameters.
class WithUnusedLayer : public nn::Cloneable<WithUnusedLayer> {
 public:
  WithUnusedLayer() : Cloneable("WithUnusedLayer") { reset(); }
  void reset() override {
    fc = register_module("fc", std::make_shared<nn::Linear>(12, 5));
    skip = register_module("skip", std::make_shared<nn::Linear>(12, 5));
  }
  Tensor forward(const Tensor& x) override { return fc->forward(x); }
  std::shared_ptr<nn::Linear> fc, skip;
};

// no_sync (two micro-batches accumulated locally, then a synchronised one) with find_unused_parameters,
// across processes as in one process: the same gradients, and the unused layer's left undefined everywhere.
TEST(DdpAcrossProcesses, NoSyncAndFindUnusedParametersWorkAsInOneProcess) {
  const int p = process_rank(), processes = process_count();
  const int64_t batch = 8 * processes;
  const auto batches = global_batches(11, batch);
  auto run = [&](DataParallel& ddp, int64_t offset, int64_t rows) {
    {
      auto guard = ddp.no_sync();
      for (int k = 0; k < 2; ++k) ddp.forward_backward(batches[k].first.narrow(0, offset, rows), batches[k].second.narrow(0, offset, rows), mse);
    }
    ddp.forward_backward(batches[2].first.narrow(0, offset, rows), batches[2].second.narrow(0, offset, rows), mse);
  };
  manual_seed(500);
  DataParallel across(std::make_shared<WithUnusedLayer>(), {.device_ids = cpus(0, 2), .mode = ParallelMode::DDP,
                                                            .find_unused_parameters = true,
                                                            .backend = CollectiveBackend::Mpi});
  run(across, batch / processes * p, batch / processes);
  manual_seed(500);
  DataParallel one(std::make_shared<WithUnusedLayer>(), {.device_ids = cpus(0, 2 * processes), .mode = ParallelMode::DDP,
                                                         .find_unused_parameters = true});
  run(one, 0, batch);
  const auto want = one.module().named_parameters(), got = across.replica(1).named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    const Tensor &g = got[k].second.grad(), &w = want[k].second.grad();
    if (got[k].first.starts_with("skip.")) {
      EXPECT_FALSE(g.defined()) << got[k].first;
      continue;
    }
    ASSERT_TRUE(g.defined() && w.defined()) << got[k].first;
    EXPECT_LE(max_abs_diff(g, w), 1e-6) << "process " << p << " " << got[k].first;
  }
}

// Different models on two processes: the same named error on both, before any parameter moves.
TEST(DdpAcrossProcesses, DifferentModelsAreRefusedNamingTheFirstDifference) {
  const int p = process_rank();
  const struct {
    int64_t hidden;
    bool extra_layer;
    const char* want;
  } cases[] = {
      {33, false, "process 1's model differs from process 0's at state entry 0: '0.weight' float32 [32, 12] in "
                  "process 0, '0.weight' float32 [33, 12] in process 1; every process must build the same model"},
      {32, true, "process 1's model differs from process 0's at state entry 4: nothing (4 entries) in process 0, "
                 "'3.weight' float32 [5, 5] in process 1"},
  };
  for (const auto& c : cases) {
    try {
      DataParallel ddp(p == 1 ? make_model(1, c.hidden, c.extra_layer) : make_model(1),
                       {.device_ids = cpus(0, 2), .mode = ParallelMode::DDP, .backend = CollectiveBackend::Mpi});
      ADD_FAILURE() << "different models were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.want), std::string::npos) << e.what();
    }
  }
}

// An optimizer that differs in one process (another lr, another type, another grouping) is refused by set_optimizer
// on every process alike, naming the first difference, in DDP, ZeRO and DP mode; the same one on both is accepted.
TEST(OptimizerAcrossProcesses, DifferentOptimizersAreRefusedNamingTheFirstDifference) {
  const int p = process_rank();
  struct Case {
    OptimizerFactory make;
    const char* want;
  };
  const OptimizerFactory adamw = [](const std::vector<Tensor>& params) {
    return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 1e-2});
  };
  const Case cases[] = {
      {[](const std::vector<Tensor>& params) {
         return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 2e-2});
       },
       "process 1's optimizer differs from process 0's at entry 1: param group 0: 4 parameters, lr 0.01, beta1 0.9, "
       "beta2 0.999, eps 1e-08, weight_decay 0.01 in process 0, param group 0: 4 parameters, lr 0.02, beta1 0.9, "
       "beta2 0.999, eps 1e-08, weight_decay 0.01 in process 1; every process must build the same optimizer"},
      {[](const std::vector<Tensor>& params) { return std::make_unique<optim::Adam>(params, optim::AdamOptions{}); },
       "process 1's optimizer differs from process 0's at entry 0: type AdamW in process 0, type Adam in process 1; "
       "every process must build the same optimizer"},
  };
  for (ParallelMode mode : {ParallelMode::DDP, ParallelMode::DP}) {
    for (int zero : {0, 2}) {
      if (mode == ParallelMode::DP && zero > 0) continue;
      const std::string what = std::string(mode_name(mode)) + " zero " + std::to_string(zero);
      DataParallel dp(make_model(1), {.device_ids = cpus(0, 2), .mode = mode, .backend = CollectiveBackend::Mpi,
                                      .zero_stage = zero});
      dp.set_optimizer(adamw);  // the same everywhere
      for (const Case& c : cases) {
        try {
          dp.set_optimizer(p == 1 ? c.make : adamw);
          ADD_FAILURE() << what << ": different optimizers were accepted";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find(c.want), std::string::npos) << what << ": " << e.what();
        }
      }
    }
  }
}

// Throws in forward on cpu:0 while `armed` is set (set in one process only).
std::atomic<bool> armed{false};
class Tripwire : public nn::Cloneable<Tripwire> {
 public:
  Tripwire() : Cloneable("Tripwire") { reset(); }
  void reset() override { fc = register_module("fc", std::make_shared<nn::Linear>(12, 5)); }
  Tensor forward(const Tensor& x) override {
    if (armed && x.device() == Device::cpu(0)) throw Error("injected failure");
    return fc->forward(x);
  }
  std::shared_ptr<nn::Linear> fc;
};

// Replica 0 of process 1 throws in its third step: process 1 reports it as itself, process 0 as process 1's
// failure (not as a partner that did not arrive, which it would say only after the 60 s timeout).
TEST(DdpAcrossProcesses, AReplicaFailureInOneProcessIsTaggedOnEveryProcess) {
  const int p = process_rank();
  DataParallel ddp(std::make_shared<Tripwire>(), {.device_ids = cpus(0, 2), .mode = ParallelMode::DDP,
                                                  .backend = CollectiveBackend::Mpi,
                                                  .timeout = std::chrono::seconds(60)});
  ddp.set_optimizer([](const std::vector<Tensor>& params) {
    return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{});
  });
  Tensor x = randn({8, 12}), y = randn({8, 5});
  for (int step = 0; step < 2; ++step) ddp.train_step(x, y, mse);
  armed = p == 1;
  try {
    ddp.train_step(x, y, mse);
    ADD_FAILURE() << "the step succeeded";
  } catch (const ReplicaError& e) {
    const std::string what = e.what();
    if (p == 1) {
      EXPECT_EQ(e.replica(), 0);
      EXPECT_EQ(what, "replica 0 on cpu:0: injected failure");
    } else {
      EXPECT_NE(what.find("rank 1 failed: replica 0 on cpu:0 failed: injected failure"), std::string::npos) << what;
    }
  }
  armed = false;
}

// DP mode across processes: a master per process, the masters' gradients averaged after each backward.
TEST(DpAcrossProcesses, TwoProcessesOfTwoDevicesTrainLikeOneProcessOfFour) {
  const int p = process_rank(), processes = process_count();
  const int64_t batch = 8 * processes;
  const auto batches = global_batches(9, batch);
  DataParallel across(make_model(300 + p), {.device_ids = cpus(0, 2), .backend = CollectiveBackend::Mpi});
  ASSERT_EQ(across.process_group()->world_size(), processes);  // the masters' group
  const std::vector<double> across_losses = train(across, batches, batch / processes * p, batch / processes);
  DataParallel one(make_model(300), {.device_ids = cpus(0, 2 * processes)});
  const std::vector<double> one_losses = train(one, batches, 0, batch);
  expect_same_losses(across_losses, one_losses);
  expect_parameters_close(across.module().parameters(), one.module().parameters(), "process " + std::to_string(p));
}

TEST(DpAcrossProcesses, AReplicaFailureInOneProcessIsTaggedOnEveryProcess) {
  const int p = process_rank();
  DataParallel dp(std::make_shared<Tripwire>(), {.device_ids = cpus(0, 2), .backend = CollectiveBackend::Mpi,
                                                 .timeout = std::chrono::seconds(60)});
  dp.set_optimizer([](const std::vector<Tensor>& params) {
    return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{});
  });
  Tensor x = randn({8, 12}), y = randn({8, 5});
  dp.train_step(x, y, mse);
  armed = p == 1;
  try {
    dp.train_step(x, y, mse);
    ADD_FAILURE() << "the step succeeded";
  } catch (const Error& e) {
    const std::string what = e.what();
    if (p == 1) {
      EXPECT_NE(what.find("replica 0 on cpu:0: injected failure"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find("rank 1 failed: the DP step failed: replica 0 on cpu:0: injected failure"), std::string::npos)
          << what;
    }
  }
  armed = false;
}

TEST(DpAcrossProcesses, DifferentModelsAreRefusedNamingTheFirstDifference) {
  const int p = process_rank();
  try {
    DataParallel dp(p == 1 ? make_model(1, 33) : make_model(1), {.device_ids = cpus(0, 2), .backend = CollectiveBackend::Mpi});
    ADD_FAILURE() << "different models were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DP across processes: process 1's model differs from process 0's at state "
                                         "entry 0"), std::string::npos) << e.what();
  }
}

// GradScaler across processes (Note [One skip decision] in engine/loss_scaling.h): under no_sync each process
// keeps its own gradients; an inf planted in process 1's alone must skip the step in every process, in both
// modes, and back off every process's scale alike.
TEST(GradScalerAcrossProcesses, AnInfInOneProcessSkipsTheStepEverywhere) {
  const int p = process_rank(), processes = process_count();
  const int64_t batch = 8 * processes;
  const auto batches = global_batches(9, batch);
  for (ParallelMode mode : {ParallelMode::DDP, ParallelMode::DP}) {
    const std::string what = std::string(mode_name(mode)) + " process " + std::to_string(p);
    DataParallel across(make_model(300), {.device_ids = cpus(0, 2), .mode = mode, .backend = CollectiveBackend::Mpi});
    across.set_optimizer([](const std::vector<Tensor>& params) {
      return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 1e-2});
    });
    auto scaler = std::make_shared<optim::GradScaler>();
    across.set_grad_scaler(scaler);
    const auto& [x, y] = batches[0];
    const int64_t rows = batch / processes;
    across.train_step(x.narrow(0, rows * p, rows), y.narrow(0, rows * p, rows), mse);
    ASSERT_FALSE(across.last_step().skipped_step) << what;

    across.zero_grad();
    {
      NoSyncGuard no_sync(across);
      across.forward_backward(x.narrow(0, rows * p, rows), y.narrow(0, rows * p, rows), mse);
    }
    std::vector<std::vector<Tensor>> before;
    for (size_t r = 0; r < across.num_optimizers(); ++r) {
      before.emplace_back();
      for (const Tensor& t : across.replica(r).parameters()) before.back().push_back(t.detach().clone());
    }
    if (p == 1) {
      Tensor grad = across.module().parameters()[0].grad();
      grad.fill_(std::numeric_limits<double>::infinity());
    }
    across.optimizer_step();
    EXPECT_TRUE(across.last_step().skipped_step) << what;
    EXPECT_EQ(scaler->get_scale(), 32768.0) << what;
    for (size_t r = 0; r < across.num_optimizers(); ++r) {
      const std::vector<Tensor> now = across.replica(r).parameters();
      for (size_t k = 0; k < now.size(); ++k) {
        EXPECT_TRUE(equal(now[k], before[r][k])) << what << " replica " << r << " parameter " << k << " moved";
      }
    }
  }
}

// ZeRO across processes: the shards span every process's devices (4 ranks over 2 processes), the buckets are
// reduce-scattered (stage 2) or all-reduced (stage 1) and the parameters all-gathered by the mpi backend; the
// training is one process's plain DDP on 4 devices, and the whole optimizer state, gathered by
// consolidate_state_dict on every process, is that run's.
TEST(ZeroAcrossProcesses, TwoProcessesOfTwoDevicesTrainLikeOneProcessOfFourAndGatherTheState) {
  const int p = process_rank(), processes = process_count();
  const int64_t batch = 8 * processes;
  const auto batches = global_batches(13, batch);
  DataParallel one(make_model(400), {.device_ids = cpus(0, 2 * processes), .mode = ParallelMode::DDP});
  const std::vector<double> one_losses = train(one, batches, 0, batch);
  const optim::OptimizerStateDict want = one.optimizer(0).state_dict();
  for (int stage : {1, 2}) {
    const std::string what = "stage " + std::to_string(stage) + " process " + std::to_string(p);
    DataParallel across(make_model(400 + p), {.device_ids = cpus(0, 2), .mode = ParallelMode::DDP,
                                              .bucket_cap_mb = 0.0005, .backend = CollectiveBackend::Mpi,
                                              .zero_stage = stage});
    expect_same_losses(train(across, batches, batch / processes * p, batch / processes), one_losses);
    for (size_t r = 0; r < 2; ++r) {
      expect_parameters_close(across.replica(r).parameters(), one.module().parameters(), what + " replica " +
                              std::to_string(r));
    }
    std::string refused;
    try {
      across.optimizer(0).state_dict();
    } catch (const std::exception& e) {
      refused = e.what();
    }
    EXPECT_NE(refused.find("call DataParallel::consolidate_state_dict() on every process first"), std::string::npos)
        << what << ": " << refused;
    across.consolidate_state_dict();
    const optim::OptimizerStateDict got = across.optimizer(0).state_dict();
    ASSERT_EQ(got.tensors.size(), want.tensors.size()) << what;
    for (const auto& [i, named] : want.tensors) {
      for (const auto& [name, t] : named) {
        EXPECT_LE(max_abs_diff(got.tensors.at(i).at(name), t), 1e-6) << what << ": " << name << " of " << i;
      }
    }
    EXPECT_EQ(got.scalars, want.scalars) << what;
  }
}

}  // namespace
}  // namespace dpe
