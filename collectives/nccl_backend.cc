#include "collectives/nccl_backend.h"

namespace dpe::collectives {

namespace {

std::vector<int> logical_indices(const std::vector<Device>& devices) {
  std::vector<int> logical;
  for (const Device& d : devices) logical.push_back(static_cast<int>(d.index));
  return logical;
}

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(const std::vector<Device>& devices) {
  return std::make_unique<NcclBackend>(devices);
}

NcclBackend::NcclBackend(std::vector<Device> devices)
    : SharedMemoryBackend(std::move(devices)), comms_(std::make_unique<NcclComms>(logical_indices(devices_))) {}

NcclBackend::NcclBackend(std::vector<Device> devices, std::unique_ptr<NcclComms> comms)
    : SharedMemoryBackend(std::move(devices)), comms_(std::move(comms)) {}

std::unique_ptr<Backend> NcclBackend::shrink(const std::vector<int>& excluded, const std::vector<Device>& survivors) {
  return std::make_unique<NcclBackend>(survivors, comms_->shrink(excluded));
}

void NcclBackend::all_reduce(int rank, const PostedAll& posted) {
  comms_->all_reduce(rank, posted[rank]->tensor, posted[rank]->op);
}

void NcclBackend::broadcast(int rank, const PostedAll& posted) {
  comms_->broadcast(rank, posted[rank]->tensor, posted[rank]->root);
}

void NcclBackend::reduce(int rank, const PostedAll& posted) {
  comms_->reduce(rank, posted[rank]->tensor, posted[rank]->root, posted[rank]->op);
}

void NcclBackend::all_gather_into_tensor(int rank, const PostedAll& posted) {
  comms_->all_gather(rank, posted[rank]->flat, posted[rank]->tensor);
}

void NcclBackend::reduce_scatter_tensor(int rank, const PostedAll& posted) {
  comms_->reduce_scatter(rank, posted[rank]->tensor, posted[rank]->flat, posted[rank]->op);
}

}  // namespace dpe::collectives
