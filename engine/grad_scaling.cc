// DataParallel with a GradScaler (set_grad_scaler): the scaled backward of the step API and the optimizer
// step through the scaler, in DP and DDP mode.
//
// Note [One skip decision]
// A step with an inf or NaN gradient is skipped, and in DDP mode every replica owns an optimizer, so every
// replica must skip, or none: a replica that steps alone leaves the replicas different for the rest of the
// run, silently. The all-reduce usually leaves identical gradients, hence identical flags, but the engine does
// not rely on that: under no_sync the gradients are each replica's own, and a fault on one device (which is
// what loss scaling exists to catch) may show on that device only. So the decision is taken once:
//  1. each replica unscales its own gradients with the amp kernel (core/kernels/amp.h) and reads its flag;
//  2. one all-reduce of one value (max) over the DDP group, i.e. every replica of every process, gives every
//     replica the combined flag;
//  3. each replica records the combined flag for its optimizer (GradScaler::record_unscaled) and steps by it;
//     an optimizer its user already unscale_'d (to clip) keeps its gradients and contributes its own flag;
//  4. scaler.update() runs once, on the caller's thread, after every replica has finished.
// DP mode has one optimizer, the master's; across processes its flag is combined over the masters' group the
// same way (every process calls optimizer_step at the same point, as it calls forward_backward).
// The deterministic mode backpropagates each shard's weighted loss times the scale and steps the same way; a
// power-of-two scale is exact, so its results stay the same bits for any device count.
#include <optional>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/lost_thread.h"
#include "engine/data_parallel.h"
#include "optim/grad_scaler.h"

namespace dpe {

namespace {

// Unscales `optimizer`'s gradients and returns their flag, unless the caller already did with unscale_ (e.g.
// to clip them between forward_backward and optimizer_step, PyTorch's recipe): then the flag it recorded.
bool unscaled_found_inf(optim::GradScaler& scaler, optim::Optimizer& optimizer) {
  const std::optional<bool> recorded = scaler.recorded_found_inf(optimizer);
  return recorded ? *recorded : scaler.unscale_grads(optimizer);
}

}  // namespace

void DataParallel::set_grad_scaler(std::shared_ptr<optim::GradScaler> scaler) { scaler_ = std::move(scaler); }

Tensor DataParallel::backward_root(const Tensor& loss) const { return scaler_ ? scaler_->scale(loss) : loss; }

void DataParallel::scaled_optimizer_step() {
  optim::GradScaler& scaler = *scaler_;
  try {
    if (options_.mode == ParallelMode::DP) {
      optim::Optimizer& optimizer = *optimizers_[0];
      bool found_inf = unscaled_found_inf(scaler, optimizer);
      if (masters_) found_inf = any_over_processes(*masters_, 0, found_inf);
      scaler.record_unscaled(optimizer, found_inf);
      report_.skipped_step = !scaler.step(optimizer);
    } else {
      DPE_INTERNAL_ASSERT(optimizers_.size() == device_ids_.size(), "DDP: ", optimizers_.size(), " optimizers for ",
                          device_ids_.size(), " replicas");
      std::vector<char> stepped(optimizers_.size(), 0);
      run_replicas([&](size_t r) {
        optim::Optimizer& optimizer = *optimizers_[r];
        const bool found_inf = any_over_processes(*group_, static_cast<int>(r), unscaled_found_inf(scaler, optimizer));
        scaler.record_unscaled(optimizer, found_inf);
        const bool took_step = scaler.step(optimizer);
        checkpoint_if_lost();  // before writing into this frame (core/lost_thread.h)
        stepped[r] = took_step;
      });
      for (size_t r = 1; r < stepped.size(); ++r) {
        DPE_INTERNAL_ASSERT(stepped[r] == stepped[0], "DDP: replica ", r, " and replica 0 took different skip "
                            "decisions");
      }
      report_.skipped_step = !stepped[0];
    }
  } catch (...) {
    scaler.discard_records();  // the next step starts a clean iteration; the scale is unchanged
    throw;
  }
  scaler.update();
}

}  // namespace dpe
