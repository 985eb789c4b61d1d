// DP-mode gradient reduction into the master: bucket by bucket as soon as a bucket is ready (devices with
// their own memory), or in shares by every worker once all have finished their backward (CPU devices).
//
// Note [DP reduction overlap]
// PyTorch's DataParallel reduces all gradients in one Broadcast backward, after every replica has
// finished its whole backward. dpe registers a post-accumulate hook on every parameter of every replica;
// the parameters are grouped into buckets (reverse registration order, byte-capped, like DDP), and the
// hook that completes a bucket — its parameters' gradients are final on every replica used this step —
// reduces that bucket into the master's .grad right there, on that worker thread, while the other
// replicas are still running backward. finish() reduces what is left (parameters some replica never
// produced a gradient for).
//
// Note [DP reduction in shares]
// CPU devices share the host memory and each worker has its own cores, so a bucket reduced by the one
// worker that completed it is a serial pass the other workers wait out (for the MLP, all 2.7 MB at the end
// of the backward, since its one bucket completes last). When every device is a CPU device and every replica
// is used, the hooks reduce nothing: each worker calls reduce_share(r) after its backward, the workers meet
// (a barrier of a process group over the devices, so a failed or lost partner is an error, not a hang), and
// worker r adds its share of every gradient's elements (collectives::work_range, the in-process all-reduce's
// split of a bucket) of replicas 1..n-1 into the master's .grad, in replica order: the same sum, bit for bit.
// Parameters whose gradient is missing on some replica, or not contiguous, are left to finish(), which
// reduces them as above. The MLP's DP step at batch 512 on two cores: 4.12-4.25 ms against 4.15-4.49 in six
// alternating pairs, shorter in five (docs/BENCHMARKS.md).
//
// Semantics (PyTorch's): master.grad += sum over replicas r >= 1 of replica_r.grad, where replica 0 is the
// master itself and has already accumulated its own chunk's gradient. Replica gradients (r >= 1) are reset
// to undefined before each backward, so they hold exactly one step.
//
// Thread-safety: hooks and reduce_share run on worker threads; a bucket is reduced exactly once per step
// (atomic counter); different buckets touch disjoint tensors, different shares disjoint cache lines.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/process_group.h"
#include "core/tensor.h"
#include "engine/replica_hooks.h"
#include "scatter_gather/coalesced.h"

namespace dpe {

class DpReducer {
 public:
  // replica_params[r][p]: parameter p of replica r (r = 0 is the master) on devices[r]; same structure for
  // every r. timeout: how long reduce_share waits for the other workers.
  DpReducer(std::vector<std::vector<Tensor>> replica_params, std::vector<Device> devices, size_t bucket_bytes,
                  std::chrono::milliseconds timeout);
  ~DpReducer();
  DpReducer(const DpReducer&) = delete;
  DpReducer& operator=(const DpReducer&) = delete;

  // Arms the hooks for a backward over replicas [0, used): clears replica gradients (r >= 1), and picks the
  // reduction for the step (Note [DP reduction in shares]).
  void prepare(size_t used);
  // Called by replica r's worker right after its backward (a no-op unless the step reduces in shares): waits
  // for the other workers, then reduces replica r's share. Throws when a partner failed (abort_shares) or did
  // not come within the timeout.
  void reduce_share(size_t replica);
  // Wakes the workers waiting in reduce_share with an error carrying `reason`. Never throws.
  void abort_shares(const std::string& reason) noexcept;
  // The replicas reduce_share's last timeout waited for (empty before any): the one to blame.
  std::vector<int> missing_at_last_timeout() const;
  // Reduces every bucket not reduced yet (in shares: the parameters left out of them) and disarms. Returns the
  // transfer statistics of the whole step.
  TransferStats finish();
  // After a failed step: the hooks do nothing until the next prepare(), and nothing is reduced (a worker
  // declared lost may still be running its backward: the engine thread leaves the gradients to it).
  void disarm() { armed_.store(false); }

  size_t num_buckets() const { return buckets_.size(); }
  // Buckets reduced from hooks (before finish) in the last step: the overlap that happened.
  int64_t buckets_reduced_early() const { return reduced_early_; }
  // Parameter indices of each bucket, in bucket order.
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }

 private:
  void on_gradient_ready(size_t replica, size_t param);
  void reduce_bucket(size_t bucket);
  // Adds the replicas' gradients of `params` into the master's (reduce_add_coalesced_into) and counts them.
  void reduce_params(const std::vector<size_t>& params);
  // Whether reduce_share handles `param` this step: every used replica has a contiguous gradient.
  bool in_shares(size_t param) const;

  std::vector<std::vector<Tensor>> params_;
  std::shared_ptr<ProcessGroup> workers_;  // CPU devices only: reduce_share's barrier
  bool shares_ = false;                     // this step reduces in shares
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucket_of_;  // param -> bucket
  size_t bucket_bytes_;
  std::vector<std::unique_ptr<std::atomic<int64_t>>> pending_;  // per bucket: hooks still to come
  std::vector<std::unique_ptr<std::atomic<bool>>> reduced_;     // per bucket: done this step
  std::atomic<bool> armed_{false};
  size_t used_ = 0;
  std::mutex stats_mutex_;
  TransferStats stats_;
  int64_t reduced_early_ = 0;
  std::unique_ptr<detail::ReplicaGradientHooks> hooks_;  // last: removed before the state above
};

}  // namespace dpe
