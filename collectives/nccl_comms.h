// NCCL communicators for a ProcessGroup whose members are CUDA devices on distinct GPUs (CUDA builds only).
//
// One communicator per member, created together by ncclCommInitAll over the members' physical GPUs (rank =
// member position). Each member's thread issues its own calls on its own communicator and its device's
// stream (NCCL's one-thread-per-device pattern: calls on different communicators from different threads
// need no group). The ProcessGroup has already met every member on the host before a call, so a NCCL call
// never waits for a member that will not come.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "collectives/reduce_buffers.h"

namespace dpe {

class NcclComms {
 public:
  explicit NcclComms(const std::vector<int>& logical_devices);
  ~NcclComms();
  NcclComms(const NcclComms&) = delete;
  NcclComms& operator=(const NcclComms&) = delete;

  void all_reduce(int rank, const Tensor& tensor, ReduceOp op);
  void broadcast(int rank, const Tensor& tensor, int root);
  void reduce(int rank, const Tensor& tensor, int root, ReduceOp op);
  void all_gather(int rank, const Tensor& output, const Tensor& input);
  void reduce_scatter(int rank, const Tensor& output, const Tensor& input, ReduceOp op);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dpe
