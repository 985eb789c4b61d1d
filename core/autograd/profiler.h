// Backward profiling: each kind of autograd node's time, summed by node name over every backward() run
// while profiling is on (the backward half of torch.autograd.profiler's table), for `dpe bench --profile`.
//
// A node's time runs from just before its apply() to just after it, measured by Events (core/stream.h) on
// the device of its first defined incoming gradient: wall time on a CPU device; on a CUDA device, the
// stream's time from the first to the last of its kernels, including any wait while the host was still
// issuing them. CUDA events are read when the pass ends (one synchronisation per pass), so a profiled step
// runs a little slower than an unprofiled one: profile in separate steps from timed ones.
//
// Thread-safety: any number of threads may run backward() while profiling is on (DP's replicas); each
// pass's times are merged under a lock when it ends, so a table of n devices sums their nodes. A node that
// runs other graphs' backward passes itself (Node::runs_nested_backward: DP's gather) is not timed: the
// nodes of those passes are, so nothing counts twice. Gradient additions between nodes are not timed. Turning
// profiling on or off, reading or clearing the table while a pass runs, takes effect from the next pass.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpe::autograd {

struct NodeTime {
  std::string name;  // Node::name(), e.g. "MulBackward"
  int64_t calls = 0;
  double ms = 0;  // summed over the calls
};

void enable_backward_profile(bool on);
bool backward_profile_enabled();

// Every node name timed since the last clear, the largest total first (ties by name).
std::vector<NodeTime> backward_profile();
// Backward passes that ran with profiling on since the last clear, nested ones (DP's replicas) included.
int64_t backward_profile_passes();
void clear_backward_profile();

}  // namespace dpe::autograd
