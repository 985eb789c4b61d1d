// The devices a DataParallel runs on and their persistent replicas, with one worker thread per device: what
// every step (engine/step.h) runs on. Replica 0 is the master (the module the caller gave); the others are
// built once, at construction (cloned from it, or given by the caller in DDP mode), and live until the engine
// goes or their device is dropped.
//
// Note [Frozen parameters]
// A parameter whose requires_grad is false (a frozen backbone while fine-tuning) is PyTorch's frozen
// parameter in both modes: replicas keep the flag (clone copies it), it gets no gradient, it is left out of
// DP's reduction and DDP's buckets (so it is never an "unused parameter"), and optimizers skip it, so it stays
// bit-identical. The master's (replica 0's) flags are the model's: a change made to them after construction
// is picked up at the next step (refresh_trainable copies the flags to every replica and the step rebuilds
// its reducer); a change made to another replica alone is refused with an error naming the replica and the
// parameter. DDP replicas built by the caller must agree with replica 0's flags at construction.
//
// Thread-safety: the engine's thread calls every method; run() hands replica r to worker r alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/process_group.h"
#include "layers/module.h"
#include "scatter_gather/coalesced.h"

namespace dpe {

class DeviceWorkerPool;

class ReplicaSet {
 public:
  // given: the master alone (cloned onto every other device) or one module per device, each already on its
  // device (DDP, built by the caller). cpu_threads: intra-op threads per CPU worker (0: the pool's default);
  // timeout: the pool's straggler timeout (engine/worker_pool.h).
  ReplicaSet(std::vector<std::shared_ptr<nn::Module>> given, std::vector<Device> devices, int cpu_threads,
             std::chrono::milliseconds timeout);
  // Keeps for good what a lost worker may still reach (its replica), then joins the other workers.
  ~ReplicaSet();
  ReplicaSet(const ReplicaSet&) = delete;
  ReplicaSet& operator=(const ReplicaSet&) = delete;

  size_t size() const { return replicas_.size(); }
  const std::vector<Device>& devices() const { return devices_; }
  nn::Module& replica(size_t r) { return *replicas_.at(r); }
  const std::shared_ptr<nn::Module>& replica_ptr(size_t r) const { return replicas_.at(r); }
  // Handles taken once at construction, valid across Module::to and set_data (steps need no state_dict()
  // walk); like PyTorch's DDP, parameters registered after construction are not seen.
  const std::vector<Tensor>& state(size_t r) const { return state_[r]; }  // parameters and buffers, state_dict order
  const std::vector<std::string>& state_names() const { return state_names_; }
  const std::vector<Tensor>& buffers(size_t r) const { return buffers_[r]; }  // buffers(), a subset of state(r)
  const std::vector<Tensor>& params(size_t r) const { return params_[r]; }    // parameters(), frozen ones too
  const std::vector<std::string>& param_names() const { return param_names_; }
  // Per parameter: requires_grad when refresh_trainable last looked (Note [Frozen parameters]).
  const std::vector<bool>& trainable() const { return trainable_; }
  // Per replica, its parameters that require grad (in parameter order), and their names: what reducers take.
  std::vector<std::vector<Tensor>> trainable_params() const;
  std::vector<std::string> trainable_names() const;

  // Picks up requires_grad changes made on the master since the last call (copying the flags to every
  // replica); returns whether there were any (the step then rebuilds its reducer).
  bool refresh_trainable();
  void check_master_placement() const;  // every master tensor on devices()[0], or an error naming it
  void verify_same_model() const;       // caller-built replicas: replica 0's names, shapes, dtypes and flags

  // fn(r) on the first `count` replicas' workers, in parallel; waits for all. A replica that fails first
  // aborts `group` (when given) with its cause, so that partners waiting for it in a collective wake at once;
  // the group is reset afterwards unless a worker was lost (it may still be inside). Throws ReplicaError.
  void run(const std::function<void(size_t)>& fn, ProcessGroup* group = nullptr);
  void run(size_t count, const std::function<void(size_t)>& fn,
           const std::function<void(size_t, const std::exception_ptr&)>& on_failure = {});
  // PyTorch's replicate for persistent replicas: replicas `to` (each >= 1) get the master's parameters and
  // buffers in one coalesced broadcast.
  TransferStats replicate(const std::vector<size_t>& to, size_t bucket_bytes);

  // The workers declared lost by the pool (engine/worker_pool.h, Note [Lost workers]).
  std::vector<size_t> lost_workers() const;
  // Whether a worker of the current pool was ever lost: a group such a worker may be inside is never reset.
  bool pool_lost_workers() const;
  // What replaces or frees an object a worker may reach (a reducer, a group, an optimizer) hands it here:
  // dropped as usual, or kept for good once any worker of this set was ever lost.
  void retire(std::shared_ptr<void> object) const;
  // Drops replica r, its handles and its device, and replaces the pool by one over the survivors.
  void drop(size_t r);

  int64_t replicas_created() const { return replicas_created_; }  // clones made at construction
  int64_t threads_created() const;

 private:
  std::unique_ptr<DeviceWorkerPool> make_pool() const;

  std::vector<Device> devices_;
  std::vector<std::shared_ptr<nn::Module>> replicas_;
  std::vector<std::vector<Tensor>> state_, buffers_, params_;
  std::vector<std::string> state_names_, param_names_;
  std::vector<bool> trainable_;
  int cpu_threads_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<DeviceWorkerPool> pool_;
  bool lost_before_ = false;  // a pool replaced by drop() had lost workers
  int64_t replicas_created_ = 0;
};

// Keeps `object` alive until the process ends: a lost worker's thread may wake at any time and use it.
void keep_forever(std::shared_ptr<void> object);

}  // namespace dpe
