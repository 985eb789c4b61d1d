#include "core/cpu_cores.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <thread>

namespace dpe {

std::vector<int> usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
    }
  }
  if (cpus.empty()) {
    for (int cpu = 0; cpu < std::max(1, static_cast<int>(std::thread::hardware_concurrency())); ++cpu) {
      cpus.push_back(cpu);
    }
  }
  return cpus;
}

int usable_cores() { return static_cast<int>(usable_cpus().size()); }

int pin_this_thread(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

}  // namespace dpe
