// What the engine does when its replicas span the processes of an MPI launch (backends 'mpi' and
// 'mpi-nccl', docs/SCALE_OUT.md): the structure check both modes run before their first broadcast, the
// values every member of every process agrees on (the loss, the sample count, a flag), and DP mode's group of
// masters (one per process), whose gradients are averaged after each synchronised backward.
//
// Contract: every process constructs its DataParallel, and calls each step-API method, at the same point; a
// member's part runs on the thread that drives it (a DDP replica's worker, or the engine's thread for a master).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "collectives/process_group.h"
#include "engine/options.h"
#include "engine/replica_set.h"

namespace dpe {

// fn(r) for every member r of a group on this process, on the thread that drives it.
using EachMember = std::function<void(const std::function<void(size_t member)>& fn)>;

// PyTorch's _verify_param_shape_across_processes, naming what differs: throws, on every process alike, when a
// process's model (state names, dtypes, shapes, frozen flags of replica 0) differs from process 0's.
// `who` prefixes the message ("DDP", "DP").
void verify_structure_across_processes(ProcessGroup& group, const ReplicaSet& replicas, const char* who,
                                       const EachMember& each_member);
// The same for the optimizer set_optimizer made (replica 0's): its type, and each param group's parameter count,
// lr and hyper-parameters; a process whose optimizer differs would train another model silently.
void verify_optimizer_across_processes(ProcessGroup& group, const optim::Optimizer& optimizer, const char* who,
                                       const EachMember& each_member);

// Over every member of every process of `group` (member `rank`'s part): the mean loss from each member's
// `loss` over `samples`; the samples; whether `flag` is set anywhere (an all-reduce, max).
double loss_over_processes(ProcessGroup& group, int rank, double loss, int64_t samples);
double samples_over_processes(ProcessGroup& group, int rank, int64_t samples);
bool any_over_processes(ProcessGroup& group, int rank, bool flag);

// DP mode across processes: this process's master is the one member here of a group with one per process.
class MastersSync {
 public:
  // Builds the group, checks every process's model against process 0's and gives every master process 0's
  // parameters and buffers.
  MastersSync(ReplicaSet& replicas, const DataParallelOptions& options);
  ProcessGroup& group() { return *group_; }
  // Before a synchronised forward: process 0's master buffers everywhere.
  void broadcast_buffers();
  // After a synchronised backward: every master's trainable gradients become the global batch's mean (each
  // weighted by its share, `batch` of all processes' samples), in bucketed all-reduces of at most
  // `bucket_bytes`; returns the mean loss over every process's batch (this one's: `loss` over `batch`).
  double average(double loss, int64_t batch, StepReport& report);
  bool any(bool flag) { return any_over_processes(*group_, 0, flag); }

 private:
  ReplicaSet& replicas_;
  size_t bucket_bytes_;
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace dpe
