// How the engine divides a batch among its devices (every step and DP's forward ask it): the split rule of
// DataParallelOptions (chunk, balanced, weighted) or, with SplitRule::Auto, weights that follow each device's
// measured speed (scatter_gather/auto_split.h). Chunk i always belongs to device i: a middle device whose
// share is zero keeps its place with 0 samples (scatter_gather/chunking.h).
//
// Note [What the auto split measures]
// A device's time in a step is how long after the step (or, in DP, each phase) began it finished its part:
// the end of its forward and of its backward in DP and in the deterministic mode, and in DDP the moment it
// entered its last collective (after which it only waits for the others). Measured from the common start,
// not from when its own task began, and without subtracting the waits on the way, because what the split must
// equalise is when devices arrive. The earlier measure (each task's own forward + loss + backward, minus its
// all-reduce waits) is right for devices with nothing in common, but devices that share a core made it lie
// both ways: a task that starts while its partners hold the core does not count that delay, and while one
// device waits in a collective its partners run faster, so every device of a shared core looked faster than
// the core is. With `DPE_CPU_DEVICE_CORES="0;0;0;1"` (CNN, batch 256) the weights settled at cpu:3 0.42-0.44
// instead of about 0.5 and the auto split ran 1.19-1.33x the even split; measured this way cpu:3 gets
// 0.44-0.49 and the split 1.30-1.48x (docs/BENCHMARKS.md). The cost: waits in earlier collectives (a fast
// device held at bucket k by a slow one) count, pulling the measured times of unequal devices towards each
// other, so the split converges in more re-solves; it converges to the same point, where they arrive together.
//
// Not thread-safe: the engine's thread calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/options.h"
#include "scatter_gather/auto_split.h"

namespace dpe {

class BatchSplit {
 public:
  // The rule and weights are read from `options` at each call (the failure policy changes them there); the
  // options outlive the split (both are the engine's StepContext's).
  BatchSplit(const DataParallelOptions& options, size_t devices);

  // Per device in device order, up to the last device with a sample, summing to batch ({0} for 0). Auto:
  // by the measured speeds once the batch has a sample for every device (the chunk rule before).
  std::vector<int64_t> chunk_sizes(int64_t batch) const;
  // After a step-API step: the auto split's measurement of it (report.chunk_sizes, device_compute_ms), and its
  // weights and times into the report. Returns whether the weights changed.
  bool observe(StepReport& report);
  // SplitRule::Auto: the current weights (one per device, summing to 1); null otherwise.
  const std::vector<double>* auto_weights() const { return auto_ ? &auto_->weights() : nullptr; }

  // The failure policies: the options now say another rule (the auto split's measurements end) / one device
  // fewer (its weight already gone from the options; the auto split measures afresh).
  void rule_changed();
  void drop();

 private:
  const DataParallelOptions& options_;
  size_t devices_;
  std::unique_ptr<AutoSplit> auto_;
};

// The step API's batch: input's size along `dim` (normalised into *normalized), checked against the target's.
int64_t step_batch(const Tensor& input, const Tensor& target, int64_t dim, int64_t* normalized);

// Replica r's part of a batch: rows [offsets[r], offsets[r] + sizes[r]) along dim, on its device.
struct BatchShards {
  int64_t dim = 0;
  std::vector<int64_t> sizes, offsets;
  BatchShards(int64_t dim, std::vector<int64_t> sizes);
  // non_blocking: from a pinned batch, a copy to a CUDA device is only enqueued (as the scatter's).
  Tensor of(const Tensor& batch, size_t r, const Device& device, bool non_blocking = true) const;
};

}  // namespace dpe
