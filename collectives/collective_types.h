// The names ProcessGroup's interface and its backends share: the backends, the collectives, the reduce ops
// (reduce_buffers.h). Part of ProcessGroup's public interface; include collectives/process_group.h.
#pragma once

#include <cstddef>

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

}  // namespace dpe
