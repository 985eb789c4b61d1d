// The step API shared by DP and DDP mode: forward_backward, the optimizers, zero_grad, no_sync.
#include "core/amp/autocast.h"
#include "core/error.h"
#include "engine/data_parallel.h"
#include "engine/ddp_reducer.h"
#include "engine/gradient_reducer.h"
#include "engine/worker_pool.h"
#include "engine/timing.h"
#include "optim/grad_scaler.h"

namespace dpe {

using detail::Clock;
using detail::ms_since;

NoSyncGuard::NoSyncGuard(DataParallel& dp) : dp_(dp), previous_(dp.require_backward_grad_sync_) {
  dp_.require_backward_grad_sync_ = false;
}

NoSyncGuard::~NoSyncGuard() { dp_.require_backward_grad_sync_ = previous_; }

Tensor DataParallel::checked_loss(const LossFn& loss_fn, const Tensor& output, const Tensor& target) {
  Tensor loss = loss_fn(output, target);
  DPE_CHECK(loss.defined() && loss.numel() == 1, "DataParallel: the loss function returned ",
            loss.defined() ? shape_str(loss.shape()) : std::string("an undefined tensor"), "; expected one value");
  return loss;
}

double DataParallel::forward_backward(const Tensor& input, const Tensor& target, const LossFn& loss_fn) {
  DPE_CHECK(input.defined() && target.defined(), "DataParallel::forward_backward: undefined input or target");
  DPE_CHECK(input.dim() > 0, "DataParallel::forward_backward: the input is 0-dim; expected a batch along dim ",
            options_.dim);
  DPE_CHECK(static_cast<bool>(loss_fn), "DataParallel::forward_backward: no loss function");
  if (options_.on_device_failure == DeviceFailurePolicy::Fail) return forward_backward_once(input, target, loss_fn);
  std::vector<std::string> recovered;
  bool accumulated = false;
  for (const Tensor& p : replica_params_[0]) accumulated = accumulated || p.grad().defined();
  while (true) {
    std::vector<Tensor> buffers;
    for (const Tensor& b : replica_buffers_[0]) buffers.push_back(b.detach().clone());
    try {
      const double loss = forward_backward_once(input, target, loss_fn);
      report_.recovered_failures = std::move(recovered);
      return loss;
    } catch (const ReplicaError& failure) {
      recovered.push_back(recover(failure, buffers, accumulated));  // or rethrows
    }
  }
}

int64_t DataParallel::step_batch(const Tensor& input, const Tensor& target, int64_t* dim) const {
  *dim = normalize_dim(options_.dim, input.dim(), "DataParallel::forward_backward");
  const int64_t batch = input.size(*dim);
  DPE_CHECK(target.dim() > *dim && target.size(*dim) == batch, "DataParallel::forward_backward: target ",
            shape_str(target.shape()), " does not match the input's batch of ", batch, " along dim ", *dim);
  return batch;
}

double DataParallel::forward_backward_once(const Tensor& input, const Tensor& target, const LossFn& loss_fn) {
  double loss_value = 0;
  if (options_.deterministic) {
    loss_value = forward_backward_deterministic(input, target, loss_fn);
  } else if (options_.mode == ParallelMode::DDP) {
    report_ = StepReport{.mode = ParallelMode::DDP};
    loss_value = forward_backward_ddp(input, target, loss_fn);
  } else {
    const bool across_processes = masters_ != nullptr && require_backward_grad_sync_;
    try {
      if (across_processes) broadcast_master_buffers();
      Tensor output = forward(input);  // resets report_ and fills the scatter/broadcast/forward/gather phases
      auto start = Clock::now();
      Tensor loss = checked_loss(loss_fn, output, target.to(output_device_, /*non_blocking=*/true));
      report_.loss_ms = ms_since(start);
      start = Clock::now();
      backward_root(loss).backward();  // through DataParallelGatherNode, which fills reduce_ms, when several devices ran
      report_.backward_ms = ms_since(start);
      loss_value = loss.item();
      if (across_processes) loss_value = average_masters(loss_value, input.size(options_.dim));
    } catch (const std::exception& e) {
      // The other processes' masters are waiting for this one: tell them why (DDP's groups do it per replica).
      if (masters_ != nullptr) masters_->abort(detail::str_cat_or_empty("the DP step failed: ", e.what()));
      throw;
    }
  }
  report_.loss = loss_value;
  report_.loss_scale = scaler_ ? scaler_->get_scale() : 1.0;
  observe_split();
  refresh_memory_report();
  return loss_value;
}

void DataParallel::set_optimizer(const OptimizerFactory& make) {
  DPE_CHECK(static_cast<bool>(make), "DataParallel::set_optimizer: no factory");
  optimizer_factory_ = make;
  // A worker lost in an earlier step may still be inside its optimizer (Note [Lost workers]).
  for (auto& optimizer : optimizers_) retire(std::shared_ptr<optim::Optimizer>(std::move(optimizer)));
  optimizers_.clear();
  size_t count = options_.mode == ParallelMode::DDP ? replicas_.size() : 1;
  for (size_t r = 0; r < count; ++r) {
    optimizers_.push_back(make(replicas_[r]->parameters()));
    DPE_CHECK(optimizers_.back() != nullptr, "DataParallel::set_optimizer: the factory returned null");
  }
}

optim::Optimizer& DataParallel::optimizer(size_t replica) {
  DPE_CHECK(!optimizers_.empty(), "DataParallel: no optimizer; call set_optimizer first");
  DPE_CHECK(replica < optimizers_.size(), "DataParallel: optimizer ", replica, " does not exist; this ",
            mode_name(options_.mode), "-mode engine has ", optimizers_.size());
  return *optimizers_[replica];
}

void DataParallel::optimizer_step() {
  DPE_CHECK(!optimizers_.empty(), "DataParallel::optimizer_step: no optimizer; call set_optimizer first");
  auto start = Clock::now();
  if (scaler_ && scaler_->is_enabled()) {
    scaled_optimizer_step();  // engine/grad_scaling.cc
  } else if (options_.mode == ParallelMode::DP) {
    optimizers_[0]->step();
  } else {
    run_replicas([&](size_t r) { optimizers_[r]->step(); });
  }
  // The parameters changed in place: a cast cached on this thread under a caller's autocast guard is stale
  // (the workers' caches end with their tasks).
  amp::clear_autocast_cache();
  report_.optimizer_ms = ms_since(start);
}

void DataParallel::zero_grad() {
  size_t count = options_.mode == ParallelMode::DDP ? replicas_.size() : 1;
  for (size_t r = 0; r < count; ++r) replicas_[r]->zero_grad();
}

double DataParallel::train_step(const Tensor& input, const Tensor& target, const LossFn& loss_fn) {
  DPE_CHECK(require_backward_grad_sync_, "DataParallel::train_step inside no_sync(): the optimizer would step on "
            "gradients that were not reduced; call forward_backward there and train_step (or optimizer_step) after");
  const auto start = Clock::now();
  zero_grad();
  double loss = forward_backward(input, target, loss_fn);
  optimizer_step();
  if (auto_mode_) record_auto_step(ms_since(start));
  return loss;
}

}  // namespace dpe
