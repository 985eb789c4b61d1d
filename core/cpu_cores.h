// The cores this process may run on.
#pragma once

#include <vector>

namespace dpe {

// The CPUs the calling thread may run on, in increasing order: its affinity mask (taskset, a cgroup cpuset,
// mpirun's --bind-to, a pinned worker's own); where the mask cannot be read, 0 .. hardware_concurrency() - 1.
std::vector<int> usable_cpus();

// How many there are, so that two processes bound to a core each do not both size their pools for the whole
// machine.
int usable_cores();

// Pins the calling thread to `cpus` (non-empty); returns pthread_setaffinity_np's status (0: pinned). A CPU
// device worker pins itself with it, `dpe bench`'s one-device row to run as that worker would, and the FMA
// probe's threads one per CPU.
int pin_this_thread(const std::vector<int>& cpus);

}  // namespace dpe
