#include "collectives/collective_types.h"

namespace dpe {

const char* backend_name(CollectiveBackend backend) {
  switch (backend) {
    case CollectiveBackend::Auto: return "auto";
    case CollectiveBackend::Cpu: return "cpu";
    case CollectiveBackend::PeerCopy: return "peer-copy";
    case CollectiveBackend::Nccl: return "nccl";
    case CollectiveBackend::Mpi: return "mpi";
    case CollectiveBackend::MpiNccl: return "mpi-nccl";
  }
  return "?";
}

const char* collective_name(Collective c) {
  static constexpr const char* kNames[kNumCollectives] = {
      "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
      "gather", "scatter", "all_to_all", "barrier", "broadcast_object",
      "all_reduce_into"};
  return kNames[static_cast<size_t>(c)];
}

}  // namespace dpe
