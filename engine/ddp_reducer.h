// DDP-mode gradient reduction: PyTorch's c10d Reducer for one process driving every replica
// (docs/PYTORCH_SEMANTICS.md §2, "the DDP reducer").
//
// Buckets. Parameters are grouped into buckets of one dtype by compute_bucket_assignment_by_size. The first
// iteration uses one bucket per dtype (PyTorch disables bucketing until it has seen the real gradient-ready
// order), unless find_unused_parameters is set, in which case buckets follow reverse registration order
// with limits [first_bucket_bytes, bucket_cap_bytes]. After the first synchronised iteration the buckets are
// rebuilt once from replica 0's observed gradient-ready order with the same limits (never with
// find_unused_parameters), so the small first bucket is the one whose gradients are ready first.
//
// Backward. A post-accumulate hook on every parameter of every replica marks its gradient ready; when a
// bucket's last gradient arrives and all lower buckets are launched, the replica launches it (and any ready
// buckets after it) as a weighted all-reduce into the bucket's flat buffer (ProcessGroup::all_reduce_into,
// each replica's gradients multiplied by its weight, set_gradient_weight: n_r / N, its share of the global
// batch, so that the SUM is the global batch's mean gradient; 1 / world size, PyTorch's average of the
// replicas' means, when every shard is equal or nobody set it), in bucket index order — the same order on
// every replica whatever order its gradients become ready in. The launch happens inside backward, on the
// replica's worker thread, overlapping the rest of its backward. Note [Gradients enter their bucket in the
// all-reduce] in ddp_reducer.cc says why the hook does not copy fresh gradients.
// Without find_unused_parameters every .grad ends up as its slot in the bucket (PyTorch's
// gradient_as_bucket_view), so the reduced values need no copy out: a gradient kept from earlier backwards is
// moved into its slot before the backward (attach_gradients) and the backward accumulates there; an
// undefined one (after zero_grad) is taken by the leaf from the backward, read by the all-reduce, and replaced
// by the slot. With find_unused_parameters, finalize_backward writes the averaged buckets back into .grad.

// Unused parameters. Without find_unused_parameters a parameter that gets no gradient leaves its bucket
// incomplete and finalize_backward throws PyTorch's error naming it. With it, parameters unreachable from the
// replica's loss are marked ready (contributing zeros) before backward, a used-map is all-reduced at the end,
// and parameters unused on every replica keep their .grad untouched.
//
// ZeRO (DataParallelOptions::zero_stage, engine/zero_step.h). The buckets are fixed at construction (the
// find_unused_parameters assignment above, never rebuilt), because who owns which gradient (zero_layout(),
// engine/zero_layout.h) follows them. With shard_gradients (stage 2) a bucket is not all-reduced but
// reduce-scattered: each replica's weighted gradients are staged in a padded flat buffer of the bucket's size,
// every replica receives the sum of the shard it owns (added to shard_gradient(r, b) when one is kept from an
// earlier synchronised backward) and the bucket's .grad tensors are freed, so no replica keeps more than its
// shard of the gradients once a bucket is sent. There are no persistent bucket buffers then.
//
// no_sync. When a backward runs without prepare_for_backward (the engine's no_sync), the hooks do nothing and
// gradients accumulate locally; the next synchronised backward reduces the accumulated gradients.
//
// Thread-safety: prepare_for_backward and the accessors run on the engine's thread while no backward runs;
// replica r's hooks, mark_unused_parameters(r) and finalize_backward(r) run on replica r's worker only, and
// touch only replica r's state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "engine/replica_hooks.h"
#include "engine/timing.h"
#include "engine/zero_layout.h"
#include "collectives/process_group.h"

namespace dpe {

inline constexpr size_t kDefaultBucketCapBytes = 25u << 20;    // PyTorch's bucket_cap_mb = 25
inline constexpr size_t kDefaultFirstBucketBytes = 1u << 20;   // dist._DEFAULT_FIRST_BUCKET_BYTES

// PyTorch's compute_bucket_assignment_by_size: walks `order` (parameter indices), one running bucket per
// dtype; a bucket closes when its size reaches the current limit (so its last tensor may take it past the
// limit), and that dtype then moves on to the next limit (the last repeats). Open buckets are appended at
// the end. sort_by_min_index orders buckets by their smallest parameter index (the registration-order case).
std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(const std::vector<Tensor>& params,
                                                                   const std::vector<size_t>& order,
                                                                   const std::vector<size_t>& limits,
                                                                   bool sort_by_min_index);

struct DdpReducerOptions {
  size_t bucket_cap_bytes = kDefaultBucketCapBytes;
  size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  bool find_unused_parameters = false;
  // The dtype buckets are all-reduced in (DataParallelOptions::reduce_dtype); unset: the gradients'.
  std::optional<DType> reduce_dtype;
  // ZeRO: buckets fixed at construction and a layout of who owns what; shard_gradients: stage 2's
  // reduce-scatter (see the file comment).
  bool zero = false;
  bool shard_gradients = false;
};

class DdpReducer {
 public:
  // replica_params[r]: replica r's parameters that require grad, in registration order (same structure on
  // every replica); names: their qualified names (errors). group: one member per replica.
  DdpReducer(std::vector<std::vector<Tensor>> replica_params, std::vector<std::string> names,
             std::shared_ptr<ProcessGroup> group, DdpReducerOptions options);
  ~DdpReducer();
  DdpReducer(const DdpReducer&) = delete;
  DdpReducer& operator=(const DdpReducer&) = delete;

  // Before a synchronised backward of every replica: rebuilds the buckets if due and arms the hooks.
  void prepare_for_backward();
  // Before a synchronised backward, on replica r's worker: every defined .grad becomes its bucket slot,
  // holding the gradient accumulated so far (undefined ones stay undefined). Does nothing with
  // find_unused_parameters (unused parameters must keep .grad untouched).
  void attach_gradients(size_t replica);
  // Before a synchronised backward, on replica r's worker: replica r's gradient enters the SUM multiplied by
  // `weight` (in [0, 1]; kept until set again; 1 / world size at first). The weights of every replica of every
  // process should sum to 1.
  void set_gradient_weight(size_t replica, double weight);
  // A replica without samples this step, on its worker, instead of its backward: every parameter is marked
  // ready with a zero contribution, so its buckets take part in every all-reduce (finalize_backward follows).
  void contribute_nothing(size_t replica);
  // With find_unused_parameters: marks replica r's parameters that `loss` does not depend on as ready.
  void mark_unused_parameters(size_t replica, const Tensor& loss);
  // After replica r's backward: checks every bucket was launched, all-reduces the used-map (find_unused),
  // writes the averaged gradients into .grad. Throws PyTorch's unfinished-reduction error naming the
  // parameters that received no gradient.
  void finalize_backward(size_t replica);
  // Disarms the hooks (after finalize on every replica, or after a failed step).
  void disarm();

  size_t num_buckets() const { return buckets_.size(); }
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }
  bool buckets_rebuilt() const { return rebuilt_; }
  // The last synchronised backward: bucket launches (all-reduces) issued from hooks, i.e. during backward,
  // summed over replicas; host milliseconds replica r spent inside bucket all-reduces; bytes all-reduced
  // per replica.
  int64_t launched_during_backward() const;
  double allreduce_ms(size_t replica) const;
  // When replica r entered its last collective of the latest synchronised backward (the last bucket's
  // all-reduce, or the used-map's with find_unused_parameters): where it stopped computing and began waiting
  // for the others (the auto split's measure, Note [What the auto split measures]). Unset when it entered none
  // (no_sync, or one member in all).
  std::optional<detail::Clock::time_point> entered_last_collective(size_t replica) const;
  int64_t allreduce_bytes() const;

  // ZeRO only (options.zero): who owns which elements; rank k of the layout is the member of global rank k.
  const ZeroLayout& zero_layout() const { return *layout_; }
  // shard_gradients: replica r's reduced shard of bucket b (layout's shard_numel(b) elements), undefined before
  // a synchronised backward or after clear_shard_gradients; whether parameter p received a gradient in a
  // synchronised backward since (with find_unused_parameters, one unused on every replica does not).
  const Tensor& shard_gradient(size_t replica, size_t bucket) const;
  bool reduced(size_t replica, size_t param) const;
  // zero_grad for the shards: frees them (on replica r's worker, or while no backward runs).
  void clear_shard_gradients(size_t replica);

 private:
  struct ReplicaState;
  void assign_buckets(std::vector<std::vector<size_t>> buckets);
  void on_gradient_ready(size_t replica, size_t param);
  void mark_ready(size_t replica, size_t param, bool from_hook);
  void launch_ready_buckets(size_t replica, bool from_hook);
  void all_reduce_bucket(size_t replica, size_t bucket, const std::vector<Tensor>& pieces);
  void reduce_scatter_bucket(size_t replica, size_t bucket, const std::vector<Tensor>& pieces);

  std::vector<std::vector<Tensor>> params_;
  std::vector<std::string> names_;
  std::shared_ptr<ProcessGroup> group_;
  DdpReducerOptions options_;
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucket_of_;     // param -> bucket
  std::vector<int64_t> offset_of_;    // param -> element offset in its bucket
  std::vector<std::unique_ptr<ReplicaState>> replicas_;
  bool alone_ = false;  // one member in all, no reduce_dtype: Note [One replica in all] (ddp_reducer.cc)
  bool armed_ = false;
  bool rebuilt_ = false;
  bool rebuild_due_ = false;
  std::unique_ptr<ZeroLayout> layout_;  // options.zero
  std::vector<size_t> ready_order_;  // replica 0's gradient-ready order in the first synchronised iteration
  std::unique_ptr<detail::ReplicaGradientHooks> hooks_;  // last: removed before the state above
};

}  // namespace dpe
