#include "core/lost_thread.h"

#include <chrono>
#include <thread>

namespace dpe {

namespace {
std::atomic<int64_t> g_parked{0};
}  // namespace

thread_local const std::atomic<bool>* detail::t_lost_flag = nullptr;

void detail::park_lost_thread() {
  g_parked.fetch_add(1);
  // Sleeping needs nothing the process might destroy at exit (no mutex, no condition variable).
  while (true) std::this_thread::sleep_for(std::chrono::hours(1));
}

void set_thread_lost_flag(const std::atomic<bool>* flag) { detail::t_lost_flag = flag; }

int64_t parked_lost_threads() { return g_parked.load(); }

}  // namespace dpe
