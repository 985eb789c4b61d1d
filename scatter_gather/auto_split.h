// SplitRule::Auto: chunk sizes that follow each device's measured speed, so that unequal devices finish a
// step together (docs/DATA_PARALLEL.md, "The auto split").
//
// The engine asks sizes(batch) before each step and reports what each device did after it (observe: its
// samples and its time: how long after the step began it finished its part, Note [What the auto split
// measures] in engine/batch_split.h).
// Each device's time per sample is a moving average (weight kSmoothing on the newest step); every kEvery
// observed steps the weights are re-solved proportional to each device's speed (1 / time per sample) and
// adopted only when some device's share moves by more than kHysteresis of the batch, so that noise does not
// shuffle samples between devices every step. Every device keeps at least kMinChunk samples when the batch
// has enough (a device that gets none is never measured again). Starts with equal weights.
// Not thread-safe: the engine's driving thread calls it.
#pragma once

#include <cstdint>
#include <vector>

namespace dpe {

class AutoSplit {
 public:
  static constexpr double kSmoothing = 0.5;
  static constexpr int kEvery = 3;
  static constexpr double kHysteresis = 0.02;
  static constexpr int64_t kMinChunk = 1;

  explicit AutoSplit(int devices);

  // One size per device (zeros allowed only when batch < devices x kMinChunk), summing to batch: the
  // weights' shares by largest remainders, each at least kMinChunk.
  std::vector<int64_t> sizes(int64_t batch) const;
  // After a step: device d computed samples[d] samples in milliseconds[d] (devices with no samples or no
  // time are skipped). Sizes must be one per device.
  void observe(const std::vector<int64_t>& samples, const std::vector<double>& milliseconds);

  const std::vector<double>& weights() const { return weights_; }                 // sum to 1
  const std::vector<double>& ms_per_sample() const { return ms_per_sample_; }     // 0 until measured

 private:
  std::vector<double> weights_;
  std::vector<double> ms_per_sample_;
  int observed_ = 0;
};

}  // namespace dpe
