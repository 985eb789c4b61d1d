// The multi-process NCCL backend 'mpi-nccl' (internal to //collectives, CUDA builds only): one group over the
// CUDA devices of every process of an MPI launch, one NCCL clique of P x T ranks (global rank r = p·T + t),
// bootstrapped over MPI: construction checks that no two members of the world share a GPU (NCCL refuses one
// GPU as two ranks; the error names both and points to 'mpi'; NCCL_HOSTID counts as the host, as in NCCL), process 0 makes the unique id and broadcasts it
// over MPI, and every process creates its members' communicators (ncclCommInitRank, in one NCCL group).
//
// all_reduce, broadcast, reduce, all_gather_into_tensor and reduce_scatter_tensor run as NCCL calls on each
// member's communicator and stream, GPU to GPU across processes. Each starts with an MPI arrival token on the
// member's cross communicator (MpiComm::arrive: a process that does not come is named after the timeout,
// processes passing different arguments fail alike before any byte moves, a failure another process
// announced ends the wait) and ends with a wait for the member's stream that polls NCCL's asynchronous error,
// the other processes' announced failures and this process's abort (NcclComms::wait: on any of them, or past
// the timeout, the communicator is aborted). The wait makes these calls synchronous on the host, which is
// what lets a dead peer be an error rather than a hang. The other collectives (the list forms, gather,
// scatter, all_to_all, broadcast_object, barrier) are the MPI backend's, staged through pinned host memory.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/mpi_backend.h"
#include "collectives/nccl_comms.h"

namespace dpe::collectives {

class MpiNcclBackend final : public MpiBackend {
 public:
  // Collective over the processes (MpiBackend's checks first); throws naming two members on one GPU.
  MpiNcclBackend(std::vector<Device> devices, std::chrono::milliseconds timeout);

  void all_reduce(int rank, const PostedAll& posted) override;
  void broadcast(int rank, const PostedAll& posted) override;
  void reduce(int rank, const PostedAll& posted) override;
  void all_gather_into_tensor(int rank, const PostedAll& posted) override;
  void reduce_scatter_tensor(int rank, const PostedAll& posted) override;
  void abort(const std::string& reason) override;

 private:
  // The NCCL call `enqueue` for member `rank`, between its arrival token (`signature`) and its wait.
  template <typename Enqueue>
  void run(int rank, const char* collective, const std::vector<int64_t>& signature, const Enqueue& enqueue);
  // Another process's announced failure, or this process's abort; "" while there is none.
  std::string failure() const;

  std::chrono::milliseconds timeout_;
  std::unique_ptr<NcclComms> comms_;
  mutable std::mutex abort_mutex_;
  std::string aborted_;  // this process's abort reason (ProcessGroup::abort), under abort_mutex_
};

std::unique_ptr<Backend> make_mpi_nccl_backend(const std::vector<Device>& devices, std::chrono::milliseconds timeout);

}  // namespace dpe::collectives
