// The NCCL backend (internal to //collectives, CUDA builds only): CUDA devices on distinct GPUs. The reducing
// collectives, broadcast and the flat forms run as NCCL calls on each member's own communicator and stream
// (nccl_comms.h); gather, scatter, all_to_all, the list forms and object broadcasts keep the shared-memory
// backend's peer copies.
#pragma once

#include <memory>
#include <vector>

#include "collectives/nccl_comms.h"
#include "collectives/shared_memory_backend.h"

namespace dpe::collectives {

class NcclBackend final : public SharedMemoryBackend {
 public:
  explicit NcclBackend(std::vector<Device> devices);
  NcclBackend(std::vector<Device> devices, std::unique_ptr<NcclComms> comms);

  FlatForms flat_forms() const override { return FlatForms::Native; }

  void all_reduce(int rank, const PostedAll& posted) override;
  void broadcast(int rank, const PostedAll& posted) override;
  void reduce(int rank, const PostedAll& posted) override;
  void all_gather_into_tensor(int rank, const PostedAll& posted) override;
  void reduce_scatter_tensor(int rank, const PostedAll& posted) override;
  // ncclCommShrink (NcclComms::shrink).
  std::unique_ptr<Backend> shrink(const std::vector<int>& excluded, const std::vector<Device>& survivors) override;

 private:
  std::unique_ptr<NcclComms> comms_;
};

std::unique_ptr<Backend> make_nccl_backend(const std::vector<Device>& devices);

}  // namespace dpe::collectives
