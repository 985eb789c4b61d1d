// on_device_failure: a replica that fails in forward, in the loss or in backward, in the first step or a later
// one, is dropped and the same step redone on the survivors; an out-of-memory error shrinks the device's
// chunk instead. The training then equals one device's on the full batch (within 1e-6), and bit for bit a run
// without the failure under the deterministic mode.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "core/autograd/function.h"
#include "core/lost_thread.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "layers/activation.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "optim/adam.h"
#include "tests/testing/devices.h"
#include "tests/testing/errors.h"
#include "tests/testing/gate.h"

namespace dpe {
namespace {

using testing::cpu_devices;
using testing::error_of;
using testing::eventually;
using testing::Gate;

enum class Phase { None, Forward, Loss, Backward, OutOfMemory, Stall, StallBackward, Hang };

// Where a Phase::Hang replica waits: a kernel that does not return until the test opens the gate.
Gate* hang_gate = nullptr;

// The fault to inject: where, on which device, in which step (counted by the test).
struct Fault {
  Phase phase = Phase::None;
  Device device = Device::cpu(1);
  std::atomic<bool> armed{false};
};
Fault fault;

bool hits(Phase phase, const Tensor& x) { return fault.armed && fault.phase == phase && x.device() == fault.device; }

class Faulty : public nn::Cloneable<Faulty> {
 public:
  Faulty() : Cloneable("Faulty") { reset(); }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(6, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 3));
  }
  Tensor forward(const Tensor& x) override {
    DPE_CHECK(!hits(Phase::Forward, x), "injected failure in forward on ", x.device());
    // Past the group's timeout (1 s), within the straggler timeout after the partners fail (2 s in all).
    if (hits(Phase::Stall, x)) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    if (hits(Phase::Hang, x)) hang_gate->wait();
    DPE_CHECK_WITH(ErrorKind::OutOfMemory, !(hits(Phase::OutOfMemory, x) && x.size(0) > 3), "out of memory on ",
                   x.device(), ": injected (", x.size(0), " samples; at most 3 fit)");
    Tensor h = relu(fc1->forward(x));
    if (hits(Phase::Backward, x) || hits(Phase::StallBackward, x)) {
      // An identity whose backward throws, or takes 1.5 s (as Stall does in forward).
      const bool stall = hits(Phase::StallBackward, x);
      Tensor out = h.detach();
      autograd::record(out, {h}, "FaultyBackward", [stall](const Tensor& g) -> std::vector<Tensor> {
        DPE_CHECK(stall, "injected failure in backward");
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        return {g};
      });
      h = out;
    }
    return fc2->forward(h);
  }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

Tensor loss_fn(const Tensor& out, const Tensor& target) {
  DPE_CHECK(!hits(Phase::Loss, out), "injected failure in the loss on ", out.device());
  return nn::functional::mse_loss(out, target);
}

OptimizerFactory adamw() {
  return [](const std::vector<Tensor>& p) { return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = 1e-2}); };
}

// 6 steps on 3 devices, the fault armed in step `at` only; returns the master's parameters.
std::vector<Tensor> train(ParallelMode mode, DeviceFailurePolicy policy, Phase phase, int at, bool deterministic,
                          std::vector<std::string>* recovered = nullptr, std::vector<Device>* survivors = nullptr,
                          std::chrono::milliseconds timeout = std::chrono::minutes(5)) {
  manual_seed(91);
  DataParallel dp(std::make_shared<Faulty>(), {.device_ids = cpu_devices(3), .mode = mode, .timeout = timeout,
                                               .deterministic = deterministic, .on_device_failure = policy});
  dp.set_optimizer(adamw());
  fault.phase = phase;
  for (int step = 0; step < 6; ++step) {
    Tensor x = randn({12, 6}), y = randn({12, 3});
    fault.armed = step == at;
    dp.train_step(x, y, loss_fn);
    fault.armed = false;
    if (recovered && step == at) *recovered = dp.last_step().recovered_failures;
  }
  if (survivors) *survivors = dp.device_ids();
  return dp.module().parameters();
}

std::vector<Tensor> one_device() {
  manual_seed(91);
  DataParallel dp(std::make_shared<Faulty>(), {.device_ids = cpu_devices(1)});
  dp.set_optimizer(adamw());
  for (int step = 0; step < 6; ++step) {
    Tensor x = randn({12, 6}), y = randn({12, 3});
    dp.train_step(x, y, loss_fn);
  }
  return dp.module().parameters();
}

void expect_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) EXPECT_LE(max_abs_diff(got[k], want[k]), 1e-6) << what << " parameter " << k;
}

TEST(DeviceFailure, ADroppedDeviceLeavesTheStepAndTheTrainingWhole) {
  const std::vector<Tensor> want = one_device();
  struct Case {
    ParallelMode mode;
    Phase phase;
  };
  // DP computes its loss on the output device, outside the replicas: no replica to drop there.
  for (const Case& c : {Case{ParallelMode::DDP, Phase::Forward}, Case{ParallelMode::DDP, Phase::Loss},
                        Case{ParallelMode::DDP, Phase::Backward}, Case{ParallelMode::DP, Phase::Forward},
                        Case{ParallelMode::DP, Phase::Backward}}) {
    for (int at : {0, 3}) {
      const std::string what = std::string(mode_name(c.mode)) + " phase " + std::to_string(static_cast<int>(c.phase)) +
                               " step " + std::to_string(at);
      std::vector<std::string> recovered;
      std::vector<Device> survivors;
      expect_close(train(c.mode, DeviceFailurePolicy::DropDevice, c.phase, at, false, &recovered, &survivors), want, what);
      ASSERT_EQ(recovered.size(), 1u) << what;
      EXPECT_NE(recovered[0].find("dropped cpu:1 (replica 1): replica 1 on cpu:1: injected failure"), std::string::npos)
          << recovered[0];
      EXPECT_EQ(survivors, (std::vector<Device>{Device::cpu(0), Device::cpu(2)})) << what;
    }
  }
}

// Under the deterministic mode the survivors compute the same bits as all three devices would have.
TEST(DeviceFailure, ADroppedDeviceChangesNoBitUnderTheDeterministicMode) {
  const std::vector<Tensor> want = train(ParallelMode::DDP, DeviceFailurePolicy::Fail, Phase::None, -1, true);
  for (Phase phase : {Phase::Forward, Phase::Backward}) {
    for (ParallelMode mode : {ParallelMode::DDP, ParallelMode::DP}) {
      const std::vector<Tensor> got = train(mode, DeviceFailurePolicy::DropDevice, phase, 2, true);
      for (size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(equal(got[k], want[k])) << mode_name(mode) << " parameter " << k;
    }
  }
}

// 6 steps of `mode` on 3 devices under DropDevice with the group's `timeout`; arm(dp, step == 2) prepares the fault
// before each step. Checks that cpu:1 went and that the training is one device's; returns what step 2
// recovered from.
std::string train_dropping_in_step_2(std::chrono::milliseconds timeout,
                                     const std::function<void(DataParallel&, bool)>& arm,
                                     ParallelMode mode = ParallelMode::DDP) {
  const std::vector<Tensor> want = one_device();
  manual_seed(91);
  DataParallel dp(std::make_shared<Faulty>(), {.device_ids = cpu_devices(3), .mode = mode,
                                               .timeout = timeout,
                                               .on_device_failure = DeviceFailurePolicy::DropDevice});
  dp.set_optimizer(adamw());
  std::string recovered;
  for (int step = 0; step < 6; ++step) {
    Tensor x = randn({12, 6}), y = randn({12, 3});
    arm(dp, step == 2);
    dp.train_step(x, y, loss_fn);
    fault.armed = false;
    if (step != 2) continue;
    EXPECT_EQ(dp.last_step().recovered_failures.size(), 1u);
    if (!dp.last_step().recovered_failures.empty()) recovered = dp.last_step().recovered_failures[0];
  }
  EXPECT_EQ(dp.device_ids(), (std::vector<Device>{Device::cpu(0), Device::cpu(2)}));
  expect_close(dp.module().parameters(), want, "dropping cpu:1");
  return recovered;
}

// A member whose all-reduce fails (a gradient bucket's, inside backward): it is the one dropped, and the step
// is redone on the others.
TEST(DeviceFailure, AFailureInsideTheAllReduceDropsItsDevice) {
  fault.phase = Phase::None;
  const std::string what = train_dropping_in_step_2(std::chrono::minutes(5), [](DataParallel& dp, bool now) {
    if (now) dp.process_group()->inject_failure_for_tests(1, Collective::AllReduceInto);
  });
  EXPECT_NE(what.find("dropped cpu:1 (replica 1): replica 1 on cpu:1: "), std::string::npos) << what;
  EXPECT_NE(what.find("failure injected into all_reduce_into on member 1"), std::string::npos) << what;
}

// A replica that stalls past the group's timeout (1 s; the two others arrive within it of each other even on a
// loaded machine): its partners time out first, and the device dropped is the one they waited for, not theirs.
// It arrives (1.5 s) before the straggler timeout would declare it lost (2 s), so the step waits for it.
TEST(DeviceFailure, ADeviceThatDoesNotArriveInTimeIsTheOneDropped) {
  fault.phase = Phase::Stall;
  const int64_t parked = parked_lost_threads();
  const std::string what = train_dropping_in_step_2(std::chrono::milliseconds(1000), [](DataParallel&, bool now) {
    fault.armed = now;
  });
  EXPECT_NE(what.find("dropped cpu:1 (replica 1): it did not arrive in time: "), std::string::npos) << what;
  EXPECT_NE(what.find("waiting for cpu:1 (rank 1), which never called it"), std::string::npos) << what;
  EXPECT_EQ(parked_lost_threads(), parked);
}

// The same in DP mode, stalling in backward: the partners wait for it at the reduction into the master, which
// CPU devices make in shares after every backward (Note [DP reduction in shares] in engine/gradient_reducer.h).
TEST(DeviceFailure, DpADeviceThatDoesNotReachTheReductionInTimeIsTheOneDropped) {
  fault.phase = Phase::StallBackward;
  const int64_t parked = parked_lost_threads();
  const std::string what = train_dropping_in_step_2(
      std::chrono::milliseconds(1000), [](DataParallel&, bool now) { fault.armed = now; }, ParallelMode::DP);
  EXPECT_NE(what.find("dropped cpu:1 (replica 1): it did not arrive in time: "), std::string::npos) << what;
  EXPECT_NE(what.find("waiting for cpu:1 (rank 1), which never called it"), std::string::npos) << what;
  EXPECT_EQ(parked_lost_threads(), parked);
}

// A replica declared lost while it is inside a collective (Note [A member that leaves early] in
// collectives/process_group.cc): it stalls between the two meetings of its bucket all-reduce (a preempted
// thread; here until the test opens a gate), its partners time out at the second meeting and leave, and the
// pool declares it lost. The engine must neither reopen the group it is in (reset() used to, with the comment
// "every worker has returned") nor free what it still reads: when it goes on, it reads its partners' pieces
// and writes their buckets, which the group keeps alive, finds the group aborted, and leaves it. Before the
// fix that was a heap-use-after-free under ASan (the partners' Posted, freed as they returned) and SIGSEGV or
// heap corruption without it (`dpe train --timeout 0.001`). Run under ASan too.
TEST(DeviceFailure, AReplicaLostInsideACollectiveFindsItNeitherFreedNorReopened) {
  fault.phase = Phase::None;
  // Dropped: the step is redone on the survivors over a new group; the old one stays aborted, alive.
  auto* gate = new Gate;  // never freed: the lost thread waits on it
  ProcessGroup* old_group = nullptr;
  const std::string what = train_dropping_in_step_2(std::chrono::milliseconds(300), [&](DataParallel& dp, bool now) {
    if (!now) return;
    old_group = dp.process_group();
    old_group->inject_stall_for_tests(1, Collective::AllReduceInto, [gate] { gate->wait(); });
  });
  EXPECT_NE(what.find("dropped cpu:1 (replica 1): it did not arrive in time: "), std::string::npos) << what;
  ASSERT_NE(old_group, nullptr);
  EXPECT_EQ(old_group->members_inside(), 1);
  EXPECT_FALSE(old_group->reset());
  gate->release();
  EXPECT_TRUE(eventually([&] { return old_group->members_inside() == 0; }));

  // Under the default policy the step fails, and the group it was in is not reopened behind the lost replica.
  gate = new Gate;
  manual_seed(91);
  DataParallel dp(std::make_shared<Faulty>(), {.device_ids = cpu_devices(3), .mode = ParallelMode::DDP,
                                               .timeout = std::chrono::milliseconds(300)});
  dp.set_optimizer(adamw());
  dp.process_group()->inject_stall_for_tests(1, Collective::AllReduceInto, [gate] { gate->wait(); });
  const std::string failure = error_of([&] { dp.train_step(randn({12, 6}), randn({12, 3}), loss_fn); });
  EXPECT_NE(failure.find("all_reduce_into #"), std::string::npos) << failure;
  EXPECT_NE(failure.find("timed out after 300 ms on cpu:"), std::string::npos) << failure;  // 0 or 2
  EXPECT_NE(failure.find("waiting for cpu:1 (rank 1)"), std::string::npos) << failure;
  ProcessGroup& group = *dp.process_group();
  EXPECT_EQ(group.members_inside(), 1);
  // Still aborted: a call fails at once (in a reopened group it would wait for the stalled replica and time out).
  EXPECT_NE(error_of([&] { group.barrier(0); }).find("process group is aborted"), std::string::npos);
  gate->release();
  EXPECT_TRUE(eventually([&] { return group.members_inside() == 0; }));
}

// A replica stuck for good (a kernel that never returns; here until the test opens its gate at the end) is
// declared lost when it is still running the timeout (1 s) after another replica finished (DP: the others'
// forward; DDP: the partners' all-reduce timing out on it): dropped, and the step redone on the survivors.
// When its kernel finally returns, its thread parks at the next checkpoint (core/lost_thread.h) instead of
// running on into a step that is gone (run under ASan too).
TEST(DeviceFailure, AStuckDeviceIsDeclaredLostAndDropped) {
#if defined(__SANITIZE_THREAD__)
  // What the lost thread touched before it got stuck, the engine later frees or rewrites, and no
  // happens-before edge can order the two: the thread never synchronises again. ThreadSanitizer reports
  // those pairs however far apart in time; ASan checks that nothing is touched after being freed.
  GTEST_SKIP() << "a thread left behind cannot be ordered with the engine's later writes (see the comment)";
#endif
  const std::vector<Tensor> want = one_device();
  for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
    SCOPED_TRACE(mode_name(mode));
    hang_gate = new Gate;  // never freed: the stuck thread waits on it
    const int64_t parked = parked_lost_threads();
    std::vector<std::string> recovered;
    std::vector<Device> survivors;
    expect_close(train(mode, DeviceFailurePolicy::DropDevice, Phase::Hang, 2, false, &recovered, &survivors,
                       std::chrono::milliseconds(1000)),
                 want, mode_name(mode));
    ASSERT_EQ(recovered.size(), 1u);
    EXPECT_NE(recovered[0].find("dropped cpu:1 (replica 1): "), std::string::npos) << recovered[0];
    if (mode == ParallelMode::DP) {
      EXPECT_NE(recovered[0].find("did not finish within 1000 ms of the first device that did (stuck in a kernel or a "
                                  "wait?): the device is lost"),
                std::string::npos)
          << recovered[0];
    }
    EXPECT_EQ(survivors, (std::vector<Device>{Device::cpu(0), Device::cpu(2)}));
    hang_gate->release();
    EXPECT_TRUE(eventually([&] { return parked_lost_threads() == parked + 1; }));
  }
  // Under the default policy the step fails naming the lost device, and nothing hangs.
  hang_gate = new Gate;
  EXPECT_NE(error_of([] {
              train(ParallelMode::DP, DeviceFailurePolicy::Fail, Phase::Hang, 0, false, nullptr, nullptr,
                    std::chrono::milliseconds(500));
            }).find("replica 1 on cpu:1: did not finish within 500 ms"),
            std::string::npos);
  // retry_smaller_chunk handles out-of-memory errors only: a lost device is rethrown, saying so.
  hang_gate = new Gate;
  EXPECT_NE(error_of([] {
              train(ParallelMode::DP, DeviceFailurePolicy::RetrySmallerChunk, Phase::Hang, 0, false, nullptr, nullptr,
                    std::chrono::milliseconds(500));
            }).find("(on_device_failure could not recover: a device is lost (stuck), and retry_smaller_chunk only "
                    "handles out-of-memory errors)"),
            std::string::npos);
  fault.armed = false;
}

TEST(DeviceFailure, OutOfMemoryShrinksTheDevicesChunk) {
  const std::vector<Tensor> want = one_device();
  for (ParallelMode mode : {ParallelMode::DDP, ParallelMode::DP}) {
    std::vector<std::string> recovered;
    std::vector<Device> survivors;
    // 12 rows on 3 devices: 4 each, one too many for cpu:1; halved to 2.
    expect_close(train(mode, DeviceFailurePolicy::RetrySmallerChunk, Phase::OutOfMemory, 1, false, &recovered, &survivors),
                 want, mode_name(mode));
    ASSERT_EQ(recovered.size(), 1u);
    EXPECT_NE(recovered[0].find("cpu:1 (replica 1) ran out of memory with 4 samples; the step was redone with 2 there"),
              std::string::npos) << recovered[0];
    EXPECT_EQ(survivors.size(), 3u);
  }
}

TEST(DeviceFailure, WhatCannotBeRecoveredIsRethrownSayingWhy) {
  // The default: the failure, as before.
  EXPECT_NE(error_of([] { train(ParallelMode::DDP, DeviceFailurePolicy::Fail, Phase::Forward, 0, false); })
                .find("replica 1 on cpu:1: injected failure in forward on cpu:1"),
            std::string::npos);
  // DP's master holds the parameters. The replica is named once (it was twice: the GPU run of 2026-11-26).
  fault.device = Device::cpu(0);
  const std::string master =
      error_of([] { train(ParallelMode::DP, DeviceFailurePolicy::DropDevice, Phase::Forward, 0, false); });
  EXPECT_EQ(master.rfind("replica 0 on cpu:0: injected failure in forward on cpu:0", 0), 0u) << master;
  EXPECT_EQ(master.find("replica", 1), std::string::npos) << master;
  EXPECT_NE(master.find("(on_device_failure could not recover: DP's master is on cpu:0)"), std::string::npos) << master;
  fault.device = Device::cpu(1);
  // Not an out-of-memory error: retry_smaller_chunk does not apply.
  EXPECT_NE(error_of([] { train(ParallelMode::DDP, DeviceFailurePolicy::RetrySmallerChunk, Phase::Forward, 0, false); })
                .find("injected failure in forward"),
            std::string::npos);
  fault.armed = false;
}

}  // namespace
}  // namespace dpe
