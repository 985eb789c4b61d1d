#include "core/spin_wait.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace dpe {
namespace {

using std::chrono::microseconds;
using Clock = std::chrono::steady_clock;

TEST(SpinWaitTest, ReturnsAtOnceWhenAlreadyDone) {
  int calls = 0;
  EXPECT_TRUE(spin_until([&] { return ++calls > 0; }, microseconds(0)));
  EXPECT_EQ(calls, 1);
}

TEST(SpinWaitTest, GivesUpAfterItsBudgetSoTheCallerCanBlock) {
  const auto start = Clock::now();
  EXPECT_FALSE(spin_until([] { return false; }, microseconds(2000)));
  EXPECT_GE(Clock::now() - start, microseconds(2000));
  EXPECT_FALSE(spin_until([] { return false; }, microseconds(0)));
}

TEST(SpinWaitTest, SeesAnotherThreadsStoreAndWhatItWroteBefore) {
  std::atomic<bool> flag{false};
  int payload = 0;  // written before the release store: visible after the acquire load that sees it
  std::thread other([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    payload = 42;
    flag.store(true, std::memory_order_release);
  });
  // A budget far beyond the other thread's delay: only a spin that never sees the store returns false.
  const bool done = spin_until([&] { return flag.load(std::memory_order_acquire); }, microseconds(60'000'000));
  other.join();
  ASSERT_TRUE(done);
  EXPECT_EQ(payload, 42);
}

TEST(SpinWaitTest, SpinsOnlyWhenEveryWaitingThreadHasACore) {
  EXPECT_EQ(spin_budget(2, 2), kSpinBeforeBlocking);
  EXPECT_EQ(spin_budget(1, 16), kSpinBeforeBlocking);
  EXPECT_EQ(spin_budget(3, 2), microseconds(0));
  EXPECT_EQ(spin_budget(8, 2), microseconds(0));
}

}  // namespace
}  // namespace dpe
