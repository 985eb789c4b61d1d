// The timing the kernel benchmarks share: the best time of one call, after a first untimed call.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>

namespace dpe::bench {

// The best time of one call in ms: one untimed call (warm caches, buffers paged in), then calls repeated until
// min_seconds have passed, at least min_calls times.
inline double best_ms(double min_seconds, const std::function<void()>& call, int min_calls = 5) {
  using Clock = std::chrono::steady_clock;
  call();
  double best = 1e30;
  const Clock::time_point start = Clock::now();
  for (int rep = 0; rep < min_calls || std::chrono::duration<double>(Clock::now() - start).count() < min_seconds;
       ++rep) {
    const Clock::time_point t = Clock::now();
    call();
    best = std::min(best, std::chrono::duration<double, std::milli>(Clock::now() - t).count());
  }
  return best;
}

}  // namespace dpe::bench
