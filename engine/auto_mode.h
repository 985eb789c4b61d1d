// ParallelMode::Auto: the step API times a few train_steps in DP mode, then as many in DDP mode, and keeps
// the faster (StepReport::auto_mode says which, with both times). Each mode's first step is a warm-up, not
// timed (the first DDP step rebuilds its buckets).
#pragma once

#include <optional>
#include <vector>

#include "engine/options.h"

namespace dpe {

class AutoMode {
 public:
  // Steps per mode that are timed after the warm-up step.
  static constexpr size_t kMeasuredSteps = 3;

  // After a train_step of `step_ms` in `mode`: records it; returns the mode to switch to, if any (DDP once DP
  // is measured, then the faster once both are).
  std::optional<ParallelMode> record(ParallelMode mode, double step_ms);
  // The median time of each mode measured so far (0 until its measurement is complete), and the choice.
  StepReport::AutoMode report() const;

 private:
  std::vector<double> dp_ms_, ddp_ms_;  // after each mode's warm-up step
  bool warmed_up_ = false;              // the mode being measured has had its warm-up step
  std::optional<ParallelMode> chosen_;
};

}  // namespace dpe
