#include "engine/step.h"

#include <optional>

#include "core/amp/autocast.h"
#include "core/error.h"
#include "engine/loss_scaling.h"
#include "engine/timing.h"
#include "optim/clip_grad.h"

namespace dpe {

bool step_through_scaler(optim::GradScaler& scaler, optim::Optimizer& optimizer,
                         const std::function<bool(bool found_inf)>& combine) {
  const std::optional<bool> recorded = scaler.recorded_found_inf(optimizer);
  const bool found_inf = combine(recorded ? *recorded : scaler.unscale_grads(optimizer));
  scaler.record_unscaled(optimizer, found_inf);
  return scaler.step(optimizer);
}

void record_memory(StepContext& ctx) {
  ctx.report.memory.clear();
  for (const Device& d : ctx.replicas->devices()) ctx.report.memory.emplace_back(d, memory_stats(d));
}

Tensor checked_loss(const LossFn& loss_fn, const Tensor& output, const Tensor& target) {
  Tensor loss = loss_fn(output, target);
  DPE_CHECK(loss.defined() && loss.numel() == 1, "DataParallel: the loss function returned ",
            loss.defined() ? shape_str(loss.shape()) : std::string("an undefined tensor"), "; expected one value");
  return loss;
}

void Step::optimizer_step() {
  DPE_CHECK(!ctx_.optimizers.empty(), "DataParallel::optimizer_step: no optimizer; call set_optimizer first");
  const auto start = detail::Clock::now();
  optim::GradScaler* scaler = ctx_.scaler && ctx_.scaler->is_enabled() ? ctx_.scaler.get() : nullptr;
  if (scaler == nullptr) {
    step_optimizers(nullptr);
  } else {
    try {
      ctx_.report.skipped_step = !step_optimizers(scaler);
    } catch (...) {
      scaler->discard_records();  // the next step starts a clean iteration; the scale is unchanged
      throw;
    }
    scaler->update();
  }
  // The parameters changed in place: a cast cached on this thread under a caller's autocast guard is stale
  // (the workers' caches end with their tasks).
  amp::clear_autocast_cache();
  ctx_.report.optimizer_ms = detail::ms_since(start);
}

void Step::zero_grad() {
  for (size_t r = 0; r < owners(); ++r) ctx_.replicas->replica(r).zero_grad();
}

// Every owner's gradients are the same (DP: one owner), so each clips by the same norm.
double Step::clip_grad_norm(double max_norm) {
  double norm = 0;
  for (size_t r = 0; r < owners(); ++r) {
    const double own = optim::clip_grad_norm_(ctx_.replicas->replica(r).parameters(), max_norm);
    if (r == 0) norm = own;
  }
  return norm;
}

void Step::refresh_trainable() {
  if (ctx_.replicas->refresh_trainable()) trainable_changed();
}

}  // namespace dpe
