// The cores this process may run on.
#pragma once

namespace dpe {

// The cores this process may run on: its affinity mask (taskset, a cgroup cpuset, mpirun's --bind-to), so
// that two processes bound to a core each do not both size their pools for the whole machine.
int usable_cores();

}  // namespace dpe
