// Learning-rate schedulers (PyTorch's torch.optim.lr_scheduler, 1.13 semantics).
//
//   optim::StepLR sched(opt, /*step_size=*/30, /*gamma=*/0.1);
//   for (epoch...) { train(...); sched.step(); }
//
// Construction records each group's lr as its base lr and performs PyTorch's initial step (last_epoch
// becomes 0, the lr of epoch 0 is set). Each step() increments last_epoch and writes the new lr into every
// param group; get_last_lr() returns the lrs of the last step, one per group.
// StepLR and MultiStepLR use PyTorch's chainable form (lr *= gamma at each boundary) so their values match
// PyTorch's bit for bit, not just the closed form base_lr * gamma^k.
//
// Resuming: set_last_epoch(t) jumps to step t in O(1) (PyTorch's step(epoch), which uses each scheduler's
// closed form), so a resumed run does not replay t steps; a checkpoint's step count, however large, costs
// nothing. CosineWithWarmup computes from base_lr either way, so the jump is bit-identical to t step()
// calls; StepLR and MultiStepLR's closed form base_lr * gamma^k may differ from the chain in the last bits.
#pragma once

#include <cstdint>
#include <vector>

#include "optim/optimizer.h"

namespace dpe::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  void step();
  // Sets last_epoch to t >= 0 (as if step() had run t times after construction) and writes step t's lrs,
  // from the closed form, into the param groups. Throws on t < 0.
  void set_last_epoch(int64_t t);
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // Call at the end of the derived constructor: PyTorch's initial step.
  void initial_step() { step(); }
  // The lrs for last_epoch_ (already incremented), given the groups' current lrs.
  virtual std::vector<double> compute_lr() const = 0;
  // The lrs for last_epoch_ from base_lrs_ alone (PyTorch's _get_closed_form_lr).
  virtual std::vector<double> closed_form_lr() const = 0;
  std::vector<double> current_lrs() const;

  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = -1;

 private:
  std::vector<double> last_lr_;
};

// lr = base_lr * gamma^(floor(last_epoch / step_size)).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  std::vector<double> compute_lr() const override;
  std::vector<double> closed_form_lr() const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = base_lr * gamma^(number of milestones <= last_epoch); a milestone listed twice counts twice.
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);

 protected:
  std::vector<double> compute_lr() const override;
  std::vector<double> closed_form_lr() const override;

 private:
  std::vector<int64_t> milestones_;
  double gamma_;
};

// Linear warm-up from 0, then half a cosine down to min_lr (not a PyTorch class; the usual transformer
// schedule). With t = last_epoch (the number of step() calls), W = warmup_steps, T = total_steps:
//   t < W:       lr = base_lr * t / W
//   W <= t:      p = min(1, (t - W) / (T - W));  lr = min_lr + (base_lr - min_lr) * (1 + cos(pi * p)) / 2
// so lr reaches base_lr at t = W and stays at min_lr from t = T on. Requires 0 <= W <= T, W < T.
class CosineWithWarmup : public LRScheduler {
 public:
  CosineWithWarmup(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double min_lr = 0.0);

 protected:
  std::vector<double> compute_lr() const override;
  std::vector<double> closed_form_lr() const override;

 private:
  int64_t warmup_steps_;
  int64_t total_steps_;
  double min_lr_;
};

}  // namespace dpe::optim
