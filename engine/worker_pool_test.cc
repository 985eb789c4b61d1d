#include "engine/worker_pool.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <cstdlib>
#include <exception>
#include <new>
#include <stdexcept>
#include <cstdio>
#include <fstream>
#include <system_error>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "core/autograd/grad_mode.h"
#include "core/cpu_cores.h"
#include "core/lost_thread.h"
#include "tests/testing/devices.h"
#include "tests/testing/errors.h"
#include "tests/testing/gate.h"
#include "tests/testing/failing_new.h"

namespace dpe {
namespace {

using testing::cpu_devices;
using testing::eventually;
using testing::Gate;

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

TEST(WorkerPoolTest, ErrorsAreTaggedAndTheFirstFailureWins) {
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
    EXPECT_TRUE(e.replica() == 1 || e.replica() == 2) << e.what();  // both failed at once: either came first
    EXPECT_EQ(e.device(), Device::cpu(e.replica()));
    EXPECT_EQ(std::string(e.what()), "replica " + std::to_string(e.replica()) + " on cpu:" +
                                         std::to_string(e.replica()) + ": bad shape in replica " +
                                         std::to_string(e.replica()));
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);  // Error's own kind, carried over
    ASSERT_EQ(e.later_failures().size(), 1u);
    EXPECT_EQ(e.later_failures()[0].replica, 3 - e.replica());
    EXPECT_EQ(e.later_failures()[0].kind, ErrorKind::InvalidArgument);
  }
  EXPECT_EQ(finished.load(), 1);  // the healthy worker finished before the error was raised
  std::atomic<int> ok{0};
  pool.run(3, [&](size_t) { ++ok; });  // the next step works
  EXPECT_EQ(ok.load(), 3);
}

// A DDP-like failure: replica 2 fails, its on_failure wakes the partners, which then fail because of it.
// The caller must get replica 2's error, not the partners' (lower-index) consequences.
TEST(WorkerPoolTest, TheRootCauseIsReportedNotItsConsequences) {
  DeviceWorkerPool pool(cpu_devices(3));
  for (int round = 0; round < 20; ++round) {
    std::mutex mutex;
    std::condition_variable cv;
    bool aborted = false;
    std::vector<size_t> callbacks;
    try {
      pool.run(
          3,
          [&](size_t i) {
            if (i == 2) throw Error("out of memory in the loss");
            std::unique_lock lock(mutex);
            cv.wait(lock, [&] { return aborted; });
            throw Error("process group is aborted: replica 2 failed");
          },
          [&](size_t i, const std::exception_ptr&) {
            std::lock_guard lock(mutex);
            callbacks.push_back(i);
            aborted = true;
            cv.notify_all();
          });
      ADD_FAILURE() << "no exception";
    } catch (const ReplicaError& e) {
      EXPECT_EQ(e.replica(), 2);
      EXPECT_EQ(e.device(), Device::cpu(2));
      EXPECT_EQ(std::string(e.what()), "replica 2 on cpu:2: out of memory in the loss");
      ASSERT_EQ(e.later_failures().size(), 2u);
      for (const auto& later : e.later_failures()) {
        EXPECT_NE(later.replica, 2);
        EXPECT_EQ(later.device, Device::cpu(later.replica));
        EXPECT_EQ(later.message, "process group is aborted: replica 2 failed");
      }
    }
    EXPECT_EQ(callbacks.size(), 3u);  // once per failed worker, the root first
    EXPECT_EQ(callbacks.at(0), 2u);
  }
}

// A failure policy asks a ReplicaError's kind, never its text (engine/replica_error.h, error_kind_of): the
// first failure's kind is the ReplicaError's, and each later failure keeps its own. The replicas fail one
// after the other (each waits until the one before it has been numbered), so the order is known.
TEST(WorkerPoolTest, AReplicaErrorKeepsTheKindOfEachOriginalFailure) {
  DeviceWorkerPool pool(cpu_devices(5));
  std::mutex mutex;
  std::condition_variable cv;
  size_t turn = 0;
  const auto task = [&](size_t i) {
    {
      std::unique_lock lock(mutex);
      cv.wait(lock, [&] { return turn == i; });
    }
    DPE_CHECK_WITH(ErrorKind::OutOfMemory, i != 0, "out of memory on ", Device::cpu(0), ": injected");
    if (i == 1) throw std::bad_alloc();
    if (i == 2) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again), "no thread");
    if (i == 3) throw std::runtime_error("a loss function's own error");
    DPE_INTERNAL_ASSERT(false, "injected");
  };
  const auto on_failure = [&](size_t i, const std::exception_ptr&) {
    std::lock_guard lock(mutex);
    turn = i + 1;
    cv.notify_all();
  };
  try {
    pool.run(5, task, on_failure);
    ADD_FAILURE() << "no exception";
  } catch (const ReplicaError& e) {
    EXPECT_EQ(e.replica(), 0);
    EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory) << e.what();
    EXPECT_NE(e.message().find("out of memory on cpu:0: injected"), std::string::npos) << e.message();
    const std::vector<ErrorKind> expected = {ErrorKind::OutOfMemory, ErrorKind::OutOfMemory,
                                             ErrorKind::InvalidArgument, ErrorKind::Internal};
    ASSERT_EQ(e.later_failures().size(), expected.size());
    for (size_t k = 0; k < expected.size(); ++k) {
      EXPECT_EQ(e.later_failures()[k].replica, static_cast<int>(k + 1));
      EXPECT_EQ(e.later_failures()[k].kind, expected[k])
          << "replica " << k + 1 << ": " << e.later_failures()[k].message;
    }
  }
  // A std::bad_alloc that comes first: the ReplicaError is of kind OutOfMemory, its message as before.
  try {
    pool.run(2, [](size_t i) {
      if (i == 1) throw std::bad_alloc();
    });
    ADD_FAILURE() << "no exception";
  } catch (const ReplicaError& e) {
    EXPECT_EQ(e.replica(), 1);
    EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory);
    EXPECT_NE(e.message().find("out of memory ("), std::string::npos) << e.message();
    EXPECT_TRUE(e.later_failures().empty());
  }
  EXPECT_EQ(error_kind_of(nullptr), ErrorKind::InvalidArgument);
  EXPECT_EQ(error_kind_of(std::make_exception_ptr(Error("x", ErrorKind::Timeout))), ErrorKind::Timeout);
  EXPECT_EQ(error_kind_of(std::make_exception_ptr(42)), ErrorKind::InvalidArgument);
  EXPECT_EQ(error_kind_of(std::make_exception_ptr(std::system_error(std::make_error_code(std::errc::io_error)))),
            ErrorKind::InvalidArgument);
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

// Note [A run allocates nothing] (engine/worker_pool.cc): with every allocation on every thread failing, a
// run still hands out its tasks, carries the grad mode, and leaves the pool usable. It used to build each
// worker's task as a std::function (an allocation after the run had started: run() threw and left the
// workers half-started) and to wrap it again on the worker outside any try (std::terminate: seen under
// `ulimit -v` in dpe_errors_test).
TEST(WorkerPoolTest, ARunAllocatesNothing) {
  DeviceWorkerPool pool(cpu_devices(3));
  std::atomic<int> ran{0}, grad_enabled{0};
  const std::function<void(size_t)> task = [&](size_t) {
    ran.fetch_add(1);
    grad_enabled.fetch_add(GradMode::is_enabled() ? 1 : 0);
  };
  pool.run(3, task);  // each worker's oneTBB arena is set up by its first task
  {
    NoGradGuard no_grad;
    testing::FailingNew fail;
    pool.run(3, task);
  }
  EXPECT_EQ(ran.load(), 6);
  EXPECT_EQ(grad_enabled.load(), 3);
  pool.run(3, task);
  EXPECT_EQ(ran.load(), 9);
}

// A worker thread that cannot be created (memory or the thread limit exhausted) is an exception from the
// constructor, not std::terminate from destroying the workers already started (seen: `ulimit -v 150000;
// dpe train --model cnn`). In a forked child whose address space leaves room for one more 8 MiB thread stack;
// 16 workers are more than glibc's cache of freed stacks (40 MiB) can serve. The child sets that stack size
// itself: glibc's default is `ulimit -s`, which differs between machines (at 512 KiB every worker would fit).
TEST(WorkerPoolTest, ThreadCreationFailureIsAnErrorNotAnAbort) {
  const std::vector<Device> devices = cpu_devices(16);
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0 || pthread_attr_setstacksize(&attr, size_t{8} << 20) != 0 ||
        pthread_setattr_default_np(&attr) != 0) {
      _exit(4);
    }
    std::ifstream statm("/proc/self/statm");
    int64_t pages = 0;
    statm >> pages;
    rlimit limit{static_cast<rlim_t>(pages * sysconf(_SC_PAGESIZE) + (12 << 20)), RLIM_INFINITY};
    if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(3);
    try {
      DeviceWorkerPool pool(devices);
      _exit(2);  // every thread started: the limit did not bite
    } catch (const std::system_error&) {
      _exit(0);
    } catch (...) {
      _exit(1);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status) << " (6: std::terminate)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: another exception; 2: no failure; 3: setrlimit failed; 4: the stack size";
}

// Note [Lost workers]: a worker still running 200 ms after the first one finished is declared lost: run()
// returns with its failure, the worker never runs again, and the pool's destructor does not wait for it.
// When its "kernel" returns, the thread parks at the next lost-thread checkpoint and goes no further.
TEST(WorkerPoolTest, AWorkerStuckPastTheStragglerTimeoutIsDeclaredLost) {
  Gate gate;
  std::atomic<bool> past_checkpoint{false};
  const int64_t parked_before = parked_lost_threads();
  {
    DeviceWorkerPool pool(cpu_devices(3), 0, std::chrono::milliseconds(200));
    const std::function<void(size_t)> task = [&](size_t i) {
      if (i != 1) return;
      gate.wait();             // stuck "in a kernel"
      checkpoint_if_lost();    // where the kernel's dispatch returns
      past_checkpoint = true;  // a write into the caller's frame: must never happen once lost
    };
    const auto start = std::chrono::steady_clock::now();
    try {
      pool.run(3, task);
      ADD_FAILURE() << "run() returned without the stuck worker's failure";
    } catch (const ReplicaError& e) {
      EXPECT_EQ(e.replica(), 1);
      EXPECT_EQ(e.device(), Device::cpu(1));
      EXPECT_NE(std::string(e.what()).find("did not finish within 200 ms of the first device that did (stuck in a "
                                           "kernel or a wait?): the device is lost"),
                std::string::npos)
          << e.what();
      EXPECT_EQ(e.kind(), ErrorKind::DeviceLost);
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_EQ(pool.lost_workers(), (std::vector<size_t>{1}));
    EXPECT_NE(testing::error_of([&] { pool.run(3, task); })
                  .find("the worker of cpu:1 (replica 1) was lost in an earlier run"),
              std::string::npos);
    std::atomic<int> ran{0};
    pool.run(1, [&](size_t) { ran.fetch_add(1); });  // the others still work
    EXPECT_EQ(ran.load(), 1);
  }  // the destructor leaves the lost thread behind
  gate.release();  // the kernel returns
  EXPECT_TRUE(eventually([&] { return parked_lost_threads() == parked_before + 1; }));
  EXPECT_FALSE(past_checkpoint.load());
}

// The first failure stays the cause; a worker lost afterwards is reported after it. A worker that is only
// slower than the others, within the timeout, is not lost.
TEST(WorkerPoolTest, ALostWorkerComesAfterTheFailureThatCausedIt) {
  Gate gate;
  const int64_t parked_before = parked_lost_threads();
  {
    DeviceWorkerPool pool(cpu_devices(3), 0, std::chrono::milliseconds(300));
    pool.run(3, [](size_t i) {
      if (i == 2) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // slower, within the timeout
    });
    EXPECT_TRUE(pool.lost_workers().empty());
    const std::function<void(size_t)> task = [&](size_t i) {
      if (i == 0) DPE_CHECK(false, "injected failure");
      if (i == 2) {
        gate.wait();
        checkpoint_if_lost();
      }
    };
    try {
      pool.run(3, task);
      ADD_FAILURE() << "no failure";
    } catch (const ReplicaError& e) {
      EXPECT_EQ(e.replica(), 0);
      EXPECT_NE(std::string(e.what()).find("injected failure"), std::string::npos) << e.what();
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);  // the cause's kind, not the lost worker's
      ASSERT_EQ(e.later_failures().size(), 1u);
      EXPECT_EQ(e.later_failures()[0].replica, 2);
      EXPECT_NE(e.later_failures()[0].message.find("the device is lost"), std::string::npos);
      EXPECT_EQ(e.later_failures()[0].kind, ErrorKind::DeviceLost);
    }
    EXPECT_EQ(pool.lost_workers(), (std::vector<size_t>{2}));
  }
  gate.release();
  EXPECT_TRUE(eventually([&] { return parked_lost_threads() == parked_before + 1; }));
}

// $DPE_CPU_DEVICE_CORES makes CPU devices unequal: each pinned worker runs on its cores only.
TEST(WorkerPoolTest, PinsCpuDevicesToTheCoresDpeCpuDeviceCoresNames) {
  EXPECT_EQ(parse_cpu_device_cores("0;0;;0"), (std::vector<std::vector<int>>{{0}, {0}, {}, {0}}));
  EXPECT_NE(testing::error_of([] { parse_cpu_device_cores("0;x"); })
                .find("DPE_CPU_DEVICE_CORES='0;x': entry 1 ('x', for cpu:1) is not a comma list of core numbers"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { parse_cpu_device_cores("0,1000"); })
                .find("core 1000 (for cpu:0) is not one this process may run on (its affinity mask has " +
                      std::to_string(usable_cpus().size()) + " CPUs, from "),
            std::string::npos);
  // The first CPU this process may run on: a cpuset need not hold CPU 0.
  const int core = usable_cpus().front();
  ::setenv("DPE_CPU_DEVICE_CORES", (";" + std::to_string(core)).c_str(), 1);
  // What the pool pins each device to, and what `dpe bench`'s one-device row pins its thread to.
  EXPECT_EQ(pinned_cpu_device_cores(Device::cpu(0)), std::vector<int>{});
  EXPECT_EQ(pinned_cpu_device_cores(Device::cpu(1)), std::vector<int>{core});
  EXPECT_EQ(pinned_cpu_device_cores(Device::cpu(2)), std::vector<int>{});  // no entry
  EXPECT_EQ(pinned_cpu_device_cores(Device::cuda(0)), std::vector<int>{});
  std::vector<int> cores(2, -1), count(2, -1);
  {
    DeviceWorkerPool pool(cpu_devices(2));
    pool.run(2, [&](size_t i) {
      cpu_set_t set;
      CPU_ZERO(&set);
      sched_getaffinity(0, sizeof set, &set);
      count[i] = CPU_COUNT(&set);
      cores[i] = CPU_ISSET(core, &set) ? core : -1;
    });
  }
  ::unsetenv("DPE_CPU_DEVICE_CORES");
  EXPECT_EQ(count[1], 1);  // cpu:1 on `core` alone
  EXPECT_EQ(cores[1], core);
  EXPECT_EQ(count[0], usable_cores());  // cpu:0 not pinned
}

}  // namespace
}  // namespace dpe
