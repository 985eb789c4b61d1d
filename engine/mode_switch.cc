// Switching a DataParallel between DP and DDP between steps (set_mode), and ParallelMode::Auto, which times
// both and keeps the faster. Both modes keep a replica on every device and replica 0 is the master in both,
// so a switch only moves what one mode keeps and the other lacks: DDP's process group, reducer and per-replica
// optimizers, or DP's reducer.
#include <algorithm>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "engine/data_parallel.h"
#include "engine/ddp_reducer.h"
#include "engine/gradient_reducer.h"
#include "layers/sync_batchnorm.h"

namespace dpe {

namespace {

// Steps per mode that Auto times after one warm-up step (the first DDP step rebuilds its buckets).
constexpr size_t kAutoMeasuredSteps = 3;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

void DataParallel::set_mode(ParallelMode mode) {
  DPE_CHECK(mode != ParallelMode::Auto, "DataParallel::set_mode(auto): Auto is chosen at construction "
            "(DataParallelOptions::mode); expected dp or ddp");
  DPE_CHECK(require_backward_grad_sync_, "DataParallel::set_mode inside no_sync(): the accumulated gradients "
            "would be dropped; switch between steps");
  DPE_CHECK(!spans_processes(options_.backend), "DataParallel::set_mode: switching modes across processes "
            "(backend '", backend_name(options_.backend), "') is not supported; construct a new DataParallel");
  if (mode == options_.mode) return;
  NoGradGuard no_grad;
  for (auto& replica : replicas_) replica->zero_grad();
  options_.mode = mode;
  // What goes is retired, not freed: a worker lost in an earlier step may still be inside it (Note [Lost
  // workers] in engine/worker_pool.cc).
  if (mode == ParallelMode::DDP) {
    retire(std::shared_ptr<GradientReducer>(std::move(reducer_)));
    init_ddp();  // replica 0's (the master's) parameters and buffers to every replica; SyncBatchNorm's groups
  } else {
    retire(std::shared_ptr<DdpReducer>(std::move(ddp_reducer_)));  // its hooks go with it (or stay, disarmed)
    for (size_t r = 0; r < replicas_.size(); ++r) nn::set_sync_batchnorm_group(*replicas_[r], nullptr, static_cast<int>(r));
    retire(std::move(group_));
  }
  build_reducer();
  if (optimizers_.empty()) return;
  // Replica 0's optimizer is the master's in both modes; DDP gives every other replica one with its state.
  for (size_t r = 1; r < optimizers_.size(); ++r) retire(std::shared_ptr<optim::Optimizer>(std::move(optimizers_[r])));
  optimizers_.resize(1);
  if (mode == ParallelMode::DP) return;
  const optim::OptimizerStateDict state = optimizers_[0]->state_dict();
  for (size_t r = 1; r < replicas_.size(); ++r) {
    optimizers_.push_back(optimizer_factory_(replicas_[r]->parameters()));
    optimizers_.back()->load_state_dict(state);
  }
}

void DataParallel::record_auto_step(double step_ms) {
  AutoModeState& state = *auto_mode_;
  if (!state.chosen) {
    std::vector<double>& mine = options_.mode == ParallelMode::DP ? state.dp_ms : state.ddp_ms;
    if (state.warmed_up) mine.push_back(step_ms);
    state.warmed_up = true;
    if (mine.size() == kAutoMeasuredSteps) {
      state.warmed_up = false;
      if (options_.mode == ParallelMode::DP) {
        set_mode(ParallelMode::DDP);
      } else {
        state.chosen = median(state.dp_ms) <= median(state.ddp_ms) ? ParallelMode::DP : ParallelMode::DDP;
        set_mode(*state.chosen);
      }
    }
  }
  // A mode's time once its measurement is complete.
  auto measured = [](const std::vector<double>& v) { return v.size() == kAutoMeasuredSteps ? median(v) : 0.0; };
  report_.auto_mode = StepReport::AutoMode{.dp_step_ms = measured(state.dp_ms), .ddp_step_ms = measured(state.ddp_ms),
                                           .chosen = state.chosen};
}

}  // namespace dpe
