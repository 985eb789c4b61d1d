// NCCL communicators for a ProcessGroup whose members are CUDA devices on distinct GPUs (CUDA builds only).
//
// One communicator per member. In one process (backend 'nccl'): created together by ncclCommInitAll over the
// members' physical GPUs (rank = member position). Across processes (backend 'mpi-nccl'): each process creates
// its members' communicators of one NCCL clique of world_size ranks from a unique id made by one process and
// sent to the others (rank = first_rank + member position); every process must call the constructor, and NCCL
// waits for all of them. Each member's thread issues its own calls on its own communicator and its device's
// stream (NCCL's one-thread-per-device pattern: calls on different communicators from different threads
// need no group). The ProcessGroup has already met every member on the host before a call, so a NCCL call
// never waits for a member that will not come.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "collectives/reduce_buffers.h"

namespace dpe {

// ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES): what one process makes and sends to the others.
using NcclUniqueId = std::array<char, 128>;
NcclUniqueId make_nccl_unique_id();

class NcclComms {
 public:
  explicit NcclComms(const std::vector<int>& logical_devices);
  NcclComms(const std::vector<int>& logical_devices, const NcclUniqueId& id, int world_size, int first_rank);
  ~NcclComms();
  NcclComms(const NcclComms&) = delete;
  NcclComms& operator=(const NcclComms&) = delete;

  void all_reduce(int rank, const Tensor& tensor, ReduceOp op);
  void broadcast(int rank, const Tensor& tensor, int root);
  void reduce(int rank, const Tensor& tensor, int root, ReduceOp op);
  void all_gather(int rank, const Tensor& output, const Tensor& input);
  void reduce_scatter(int rank, const Tensor& output, const Tensor& input, ReduceOp op);

  // Waits until member `rank`'s stream has done everything enqueued so far, polling NCCL's asynchronous error
  // and `failed_elsewhere` (a reason, or "" while there is none). On an error, a reason, or past `deadline`,
  // aborts member `rank`'s communicator (ncclCommAbort: a collective stuck waiting for a peer that will not
  // come ends) and throws naming `what`: of kind ErrorKind::Timeout past the deadline, ErrorKind::Aborted on a
  // reason from `failed_elsewhere`; every later call on it throws, of kind ErrorKind::Aborted. Member `rank`'s
  // thread only.
  void wait(int rank, std::chrono::steady_clock::time_point deadline,
            const std::function<std::string()>& failed_elsewhere, const std::string& what);

  // The communicators of this process's members that remain when the clique's ranks `excluded` (sorted,
  // distinct, in [0, world_size)) go, by ncclCommShrink with NCCL_SHRINK_ABORT (operations still in flight on
  // these communicators end first), ranks renumbered in order; with nobody excluded, by ncclCommSplit (NCCL's
  // shrink must exclude a rank). Across processes, every process with a surviving member calls it, and a
  // process whose members are all excluded must not (NCCL's rule; it calls abort()). These communicators are
  // aborted: every later call on them throws. No member may be inside a call.
  std::unique_ptr<NcclComms> shrink(const std::vector<int>& excluded);

  // Aborts every communicator of this process (ncclCommAbort: no waiting for peers); every later call on them
  // throws, naming `why`.
  void abort(const std::string& why);

 private:
  struct Impl;
  explicit NcclComms(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dpe
