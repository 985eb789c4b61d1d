// Spin-then-park: the first part of a wait for another thread, before falling back to a blocking wait.
//
// Why: a condition-variable wake-up costs 20-40 us on the 2-vCPU VMs dpe is measured on (a futex wake and a
// reschedule on the other vCPU), and a DDP step meets the other replicas twice per gradient bucket. When
// the other side arrives within microseconds, as it does when every device has its own core, a short spin
// sees it at once (docs/BENCHMARKS.md, "Waiting for each other").
//
// Contract: spin_until(done, budget) calls done() until it returns true or `budget` has passed, and returns
// done()'s last value; the caller then blocks as it did before. done() must be a cheap read of an atomic
// (acquire) with no side effects. The spin pauses between reads (x86 `pause`) and yields the core after the
// first microseconds, so a thread waited for on the same core (more devices than cores) still gets to run.
#pragma once

#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dpe {

// How long dpe's waits for another device's thread spin before they block: a DDP bucket's two meetings and
// a DeviceWorkerPool run's hand-over and return. 100 us covered the wake-ups measured; 300 and 1000 us gained
// nothing more (docs/BENCHMARKS.md).
inline constexpr std::chrono::microseconds kSpinBeforeBlocking{100};

// The budget for `threads` threads that wait for one another on `cores` cores: kSpinBeforeBlocking when each
// can have a core of its own, else none (a spinning thread would hold a core a thread it waits for needs:
// 8 CPU devices on 2 cores ran DP 9% slower with the spin; docs/BENCHMARKS.md).
inline std::chrono::microseconds spin_budget(int threads, int cores) {
  return threads <= cores ? kSpinBeforeBlocking : std::chrono::microseconds(0);
}

template <typename Done>
bool spin_until(Done&& done, std::chrono::microseconds budget) {
  using Clock = std::chrono::steady_clock;
  if (done()) return true;
  if (budget.count() <= 0) return false;
  const auto deadline = Clock::now() + budget;
  for (int i = 0;; ++i) {
    for (int k = 0; k < 32; ++k) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    }
    if (Clock::now() >= deadline) return done();
    if (i >= 16) std::this_thread::yield();
  }
}

}  // namespace dpe
