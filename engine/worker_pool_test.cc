#include "engine/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "core/autograd/grad_mode.h"
#include "tests/testing/devices.h"

namespace dpe {
namespace {

using testing::cpu_devices;

TEST(WorkerPoolTest, RunsEachReplicaOnItsOwnPersistentThread) {
  DeviceWorkerPool pool(cpu_devices(3));
  std::mutex m;
  std::vector<std::set<std::thread::id>> ids(3);
  for (int step = 0; step < 20; ++step) {
    pool.run(3, [&](size_t i) {
      std::lock_guard lock(m);
      ids[i].insert(std::this_thread::get_id());
    });
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ids[i].size(), 1u) << "replica " << i << " moved between threads";
    EXPECT_EQ(ids[i].count(std::this_thread::get_id()), 0u);
  }
  EXPECT_NE(*ids[0].begin(), *ids[1].begin());
  EXPECT_EQ(pool.threads_created(), 3);  // no thread per step
  std::vector<int> ran(3, 0);
  pool.run(2, [&](size_t i) { ran[i] = 1; });  // a subset
  EXPECT_EQ(ran, (std::vector<int>{1, 1, 0}));
}

TEST(WorkerPoolTest, ErrorsAreTaggedAndTheLowestReplicaWins) {
  DeviceWorkerPool pool(cpu_devices(3));
  std::atomic<int> finished{0};
  try {
    pool.run(3, [&](size_t i) {
      if (i >= 1) throw Error("bad shape in replica " + std::to_string(i));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ++finished;
    });
    ADD_FAILURE() << "no exception";
  } catch (const ReplicaError& e) {
    EXPECT_EQ(e.replica(), 1);
    EXPECT_EQ(e.device(), Device::cpu(1));
    EXPECT_EQ(std::string(e.what()), "replica 1 on cpu:1: bad shape in replica 1");
  }
  EXPECT_EQ(finished.load(), 1);  // the healthy worker finished before the error was raised
  std::atomic<int> ok{0};
  pool.run(3, [&](size_t) { ++ok; });  // the next step works
  EXPECT_EQ(ok.load(), 3);
}

TEST(WorkerPoolTest, CarriesGradModeAndLimitsCpuThreads) {
  DeviceWorkerPool pool(cpu_devices(2));
  std::vector<int> enabled(2, -1);
  {
    NoGradGuard no_grad;
    pool.run(2, [&](size_t i) { enabled[i] = GradMode::is_enabled(); });
  }
  EXPECT_EQ(enabled, (std::vector<int>{0, 0}));
  pool.run(2, [&](size_t i) { enabled[i] = GradMode::is_enabled(); });
  EXPECT_EQ(enabled, (std::vector<int>{1, 1}));
  EXPECT_GE(pool.cpu_threads_per_device(), 1);
  EXPECT_LE(pool.cpu_threads_per_device(), std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_THROW(pool.run(3, [](size_t) {}), Error);
}

}  // namespace
}  // namespace dpe
