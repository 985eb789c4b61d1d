#include "collectives/mpi_nccl_backend.h"

#include <array>
#include <cstdlib>
#include <cstring>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_device.h"
#include "core/error.h"

namespace dpe::collectives {

namespace {

// Where a member's GPU is: the host and the PCI bus id, as NCCL tells GPUs apart (NCCL_HOSTID, when set, stands
// for the host, as in NCCL: processes given different ids may share a GPU, their traffic going through NCCL's
// network transport; that is how one GPU can test this backend). Fixed size, for MPI.
struct GpuPlace {
  std::array<char, 64> host{};
  std::array<char, 32> bus_id{};
};

GpuPlace gpu_place(const Device& device, const std::string& host) {
  GpuPlace place;
  std::strncpy(place.host.data(), host.c_str(), place.host.size() - 1);
  DPE_CUDA_CHECK(cudaDeviceGetPCIBusId(place.bus_id.data(), static_cast<int>(place.bus_id.size()),
                                       cuda::physical_device(static_cast<int>(device.index))));
  return place;
}

std::vector<int> logical_indices(const std::vector<Device>& devices) {
  std::vector<int> logical;
  for (const Device& d : devices) logical.push_back(static_cast<int>(d.index));
  return logical;
}

}  // namespace

MpiNcclBackend::MpiNcclBackend(std::vector<Device> devices, std::chrono::milliseconds timeout)
    : MpiBackend(std::move(devices), timeout), timeout_(timeout) {
  const int members = size(), world = processes() * members;
  // Every process learns every member's GPU and refuses the same pair, before NCCL would fail or hang.
  const char* host_id = std::getenv("NCCL_HOSTID");
  const std::string host = host_id != nullptr ? host_id : MpiWorld::get().place().host;
  std::vector<GpuPlace> mine, all(static_cast<size_t>(world));
  for (const Device& d : devices_) mine.push_back(gpu_place(d, host));
  cross_[0]->all_gather(mine.data(), all.data(), static_cast<int64_t>(mine.size() * sizeof(GpuPlace)),
                        "ProcessGroup construction: the members' GPUs");
  for (int a = 0; a < world; ++a) {
    for (int b = a + 1; b < world; ++b) {
      const bool same = std::strcmp(all[a].host.data(), all[b].host.data()) == 0 &&
                        std::strcmp(all[a].bus_id.data(), all[b].bus_id.data()) == 0;
      DPE_CHECK(!same, "ProcessGroup 'mpi-nccl': global ranks ", a, " (cuda:", a % members, " of process ",
                a / members, ") and ", b, " (cuda:", b % members, " of process ", b / members, ") are the same GPU (",
                all[a].bus_id.data(), " on ", all[a].host.data(), "); NCCL refuses one GPU as two ranks: give each "
                "process GPUs of its own, or use backend 'mpi' (--dist mpi), which stages through host memory");
    }
  }
  NcclUniqueId id{};
  if (process_index() == 0) id = make_nccl_unique_id();
  cross_[0]->broadcast(id.data(), static_cast<int64_t>(id.size()), 0, "ProcessGroup construction: the NCCL unique id");
  comms_ = std::make_unique<NcclComms>(logical_indices(devices_), id, world, process_index() * members);
}

void MpiNcclBackend::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (aborted_.empty()) aborted_ = reason;
  }
  MpiBackend::abort(reason);
}

std::string MpiNcclBackend::failure() const {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (!aborted_.empty()) return aborted_;
  }
  return failures_->heard();
}

template <typename Enqueue>
void MpiNcclBackend::run(int rank, const char* collective, const std::vector<int64_t>& signature,
                         const Enqueue& enqueue) {
  const std::string what = detail::str_cat(collective, ", member ", rank);
  cross_[rank]->arrive(what, signature, "elements, dtype, op, root");
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  enqueue();
  comms_->wait(rank, deadline, [this] { return failure(); }, what);
}

namespace {

std::vector<int64_t> signature_of(const Posted& p, const Tensor& t) {
  return {t.numel(), static_cast<int64_t>(t.dtype()), static_cast<int64_t>(p.op), p.root};
}

}  // namespace

void MpiNcclBackend::all_reduce(int rank, const PostedAll& posted) {
  const Posted& p = *posted[rank];
  run(rank, "all_reduce", signature_of(p, p.tensor), [&] { comms_->all_reduce(rank, p.tensor, p.op); });
}

void MpiNcclBackend::broadcast(int rank, const PostedAll& posted) {
  const Posted& p = *posted[rank];
  run(rank, "broadcast", signature_of(p, p.tensor), [&] { comms_->broadcast(rank, p.tensor, p.root); });
}

void MpiNcclBackend::reduce(int rank, const PostedAll& posted) {
  const Posted& p = *posted[rank];
  run(rank, "reduce", signature_of(p, p.tensor), [&] { comms_->reduce(rank, p.tensor, p.root, p.op); });
}

void MpiNcclBackend::all_gather_into_tensor(int rank, const PostedAll& posted) {
  const Posted& p = *posted[rank];
  run(rank, "all_gather", signature_of(p, p.tensor), [&] { comms_->all_gather(rank, p.flat, p.tensor); });
}

void MpiNcclBackend::reduce_scatter_tensor(int rank, const PostedAll& posted) {
  const Posted& p = *posted[rank];
  run(rank, "reduce_scatter", signature_of(p, p.tensor), [&] { comms_->reduce_scatter(rank, p.tensor, p.flat, p.op); });
}

std::unique_ptr<Backend> make_mpi_nccl_backend(const std::vector<Device>& devices, std::chrono::milliseconds timeout) {
  return std::make_unique<MpiNcclBackend>(devices, timeout);
}

}  // namespace dpe::collectives
