// The names ProcessGroup's interface and its backends share: the backends, the collectives, the reduce ops
// (reduce_buffers.h). Part of ProcessGroup's public interface; include collectives/process_group.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "collectives/reduce_buffers.h"

namespace dpe {

// Mpi and MpiNccl span the processes of an MPI launch (collectives/process_group.h); the others one process.
enum class CollectiveBackend { Auto, Cpu, PeerCopy, Nccl, Mpi, MpiNccl };
const char* backend_name(CollectiveBackend backend);
inline bool spans_processes(CollectiveBackend backend) {
  return backend == CollectiveBackend::Mpi || backend == CollectiveBackend::MpiNccl;
}

enum class Collective {
  AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, Gather, Scatter, AllToAll, Barrier, BroadcastObject,
  AllReduceInto
};
inline constexpr size_t kNumCollectives = 11;
const char* collective_name(Collective c);

namespace collectives {

// [begin, end) of the `count` elements (of element_bytes each) member `rank` of `n` reduces: `shares`
// (normalised, one per member; empty: 1/n each) of them, boundaries rounded up to 64-byte lines so that no two
// members write one cache line. Every member computes the same boundaries, so the ranges tile [0, count). The
// shared-memory backend's split of a reduction among CPU members, and DP's reduction in shares
// (engine/dp_reducer.h).
std::pair<int64_t, int64_t> work_range(int64_t count, size_t element_bytes, int n, int rank,
                                       const std::vector<double>& shares);

}  // namespace collectives

}  // namespace dpe
