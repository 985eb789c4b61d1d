// The names ProcessGroup's interface and its backends share: the backends, the collectives, the reduce ops
// (reduce_buffers.h). Part of ProcessGroup's public interface; include collectives/process_group.h.
#pragma once

#include <cstddef>

#include "collectives/reduce_buffers.h"

namespace dpe {

enum class CollectiveBackend { Auto, Cpu, PeerCopy, Nccl, Mpi };
const char* backend_name(CollectiveBackend backend);

enum class Collective {
  AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, Gather, Scatter, AllToAll, Barrier, BroadcastObject
};
inline constexpr size_t kNumCollectives = 10;
const char* collective_name(Collective c);

}  // namespace dpe
