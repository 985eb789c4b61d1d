#include "optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace dpe::optim {

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (const ParamGroup& g : optimizer.param_groups()) base_lrs_.push_back(g.lr);
}

std::vector<double> LRScheduler::current_lrs() const {
  std::vector<double> lrs;
  for (const ParamGroup& g : optimizer_.param_groups()) lrs.push_back(g.lr);
  return lrs;
}

void LRScheduler::step() {
  auto& groups = optimizer_.param_groups();
  DPE_CHECK(groups.size() == base_lrs_.size(), "LRScheduler: the optimizer has ", groups.size(),
            " param groups, the scheduler was created with ", base_lrs_.size());
  ++last_epoch_;
  std::vector<double> lrs = compute_lr();
  for (size_t i = 0; i < groups.size(); ++i) groups[i].lr = lrs[i];
  last_lr_ = std::move(lrs);
}

void LRScheduler::set_last_epoch(int64_t t) {
  auto& groups = optimizer_.param_groups();
  DPE_CHECK(t >= 0, "LRScheduler::set_last_epoch(", t, "): expected a step count >= 0");
  DPE_CHECK(groups.size() == base_lrs_.size(), "LRScheduler: the optimizer has ", groups.size(),
            " param groups, the scheduler was created with ", base_lrs_.size());
  last_epoch_ = t;
  std::vector<double> lrs = closed_form_lr();
  for (size_t i = 0; i < groups.size(); ++i) groups[i].lr = lrs[i];
  last_lr_ = std::move(lrs);
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  DPE_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  initial_step();
}

std::vector<double> StepLR::compute_lr() const {
  std::vector<double> lrs = current_lrs();
  if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return lrs;
  for (double& lr : lrs) lr *= gamma_;
  return lrs;
}

std::vector<double> StepLR::closed_form_lr() const {
  std::vector<double> lrs;
  const double k = static_cast<double>(last_epoch_ / step_size_);
  for (double base : base_lrs_) lrs.push_back(base * std::pow(gamma_, k));
  return lrs;
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
  initial_step();
}

std::vector<double> MultiStepLR::compute_lr() const {
  std::vector<double> lrs = current_lrs();
  const auto count = std::count(milestones_.begin(), milestones_.end(), last_epoch_);
  if (count == 0) return lrs;
  for (double& lr : lrs) lr *= std::pow(gamma_, static_cast<double>(count));
  return lrs;
}

std::vector<double> MultiStepLR::closed_form_lr() const {
  std::vector<double> lrs;
  const auto passed = std::count_if(milestones_.begin(), milestones_.end(), [&](int64_t m) { return m <= last_epoch_; });
  for (double base : base_lrs_) lrs.push_back(base * std::pow(gamma_, static_cast<double>(passed)));
  return lrs;
}

CosineWithWarmup::CosineWithWarmup(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double min_lr)
    : LRScheduler(optimizer), warmup_steps_(warmup_steps), total_steps_(total_steps), min_lr_(min_lr) {
  DPE_CHECK(warmup_steps >= 0 && warmup_steps < total_steps, "CosineWithWarmup: need 0 <= warmup_steps < total_steps, got warmup_steps ",
            warmup_steps, ", total_steps ", total_steps);
  initial_step();
}

std::vector<double> CosineWithWarmup::compute_lr() const {
  std::vector<double> lrs;
  const double t = static_cast<double>(last_epoch_);
  for (double base : base_lrs_) {
    if (last_epoch_ < warmup_steps_) {
      lrs.push_back(base * t / static_cast<double>(warmup_steps_));
    } else {
      const double p = std::min(1.0, (t - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_));
      lrs.push_back(min_lr_ + (base - min_lr_) * (1.0 + std::cos(std::numbers::pi * p)) / 2.0);
    }
  }
  return lrs;
}

// Computed from base_lrs_ and last_epoch_ only: the closed form is compute_lr itself.
std::vector<double> CosineWithWarmup::closed_form_lr() const { return compute_lr(); }

}  // namespace dpe::optim
