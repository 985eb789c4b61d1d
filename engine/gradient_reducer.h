// DP-mode gradient reduction into the master, bucket by bucket, as soon as a bucket is ready.
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
// Semantics (PyTorch's): master.grad += sum over replicas r >= 1 of replica_r.grad, where replica 0 is the
// master itself and has already accumulated its own chunk's gradient. Replica gradients (r >= 1) are reset
// to undefined before each backward, so they hold exactly one step.
//
// Thread-safety: hooks run on worker threads; a bucket is reduced exactly once per step (atomic counter);
// different buckets touch disjoint tensors.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "core/tensor.h"
#include "engine/replica_hooks.h"
#include "scatter_gather/coalesced.h"

namespace dpe {

class GradientReducer {
 public:
  // replica_params[r][p]: parameter p of replica r (r = 0 is the master); same structure for every r.
  GradientReducer(std::vector<std::vector<Tensor>> replica_params, size_t bucket_bytes);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Arms the hooks for a backward over replicas [0, used): clears replica gradients (r >= 1).
  void prepare(size_t used);
  // Reduces every bucket not reduced yet and disarms. Returns the transfer statistics of the whole step.
  TransferStats finish();

  size_t num_buckets() const { return buckets_.size(); }
  // Buckets reduced from hooks (before finish) in the last step: the overlap that happened.
  int64_t buckets_reduced_early() const { return reduced_early_; }
  // Parameter indices of each bucket, in bucket order.
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }

 private:
  void on_gradient_ready(size_t replica, size_t param);
  void reduce_bucket(size_t bucket);

  std::vector<std::vector<Tensor>> params_;
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
