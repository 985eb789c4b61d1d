#include "engine/auto_mode.h"

#include <algorithm>

namespace dpe {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

std::optional<ParallelMode> AutoMode::record(ParallelMode mode, double step_ms) {
  if (chosen_) return std::nullopt;
  std::vector<double>& mine = mode == ParallelMode::DP ? dp_ms_ : ddp_ms_;
  if (warmed_up_) mine.push_back(step_ms);
  warmed_up_ = true;
  if (mine.size() < kMeasuredSteps) return std::nullopt;
  warmed_up_ = false;
  if (mode == ParallelMode::DP) return ParallelMode::DDP;
  chosen_ = median(dp_ms_) <= median(ddp_ms_) ? ParallelMode::DP : ParallelMode::DDP;
  return chosen_;
}

StepReport::AutoMode AutoMode::report() const {
  auto measured = [](const std::vector<double>& v) { return v.size() == kMeasuredSteps ? median(v) : 0.0; };
  return {.dp_step_ms = measured(dp_ms_), .ddp_step_ms = measured(ddp_ms_), .chosen = chosen_};
}

}  // namespace dpe
