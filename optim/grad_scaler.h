// GradScaler: PyTorch's torch.amp.GradScaler for C++ (dynamic loss scaling for mixed-precision training).
//
//   optim::GradScaler scaler;                       // scale 2^16, x2 after 2000 clean steps, x0.5 on inf/NaN
//   opt.zero_grad();
//   scaler.scale(loss).backward();                  // gradients are scale x the true ones
//   scaler.unscale_(opt);                           // optional: true gradients, e.g. before clip_grad_norm_
//   scaler.step(opt);                               // unscales (if not done), skips opt.step() on inf/NaN
//   scaler.update();                                // backs off or grows the scale, once per iteration
//
// One iteration (between two update() calls), per optimizer: unscale_ at most once (a second call is an
// error, as in PyTorch), then step at most once; update() then combines what every optimizer recorded.
// Unscaling multiplies each gradient by 1/scale computed in double and rounded to float32 (PyTorch's
// scale.double().reciprocal().float()), in the gradient's dtype, and checks each element for inf/NaN with the
// core/kernels/amp.h kernel: an inf or NaN found in any gradient makes step() skip optimizer.step(), leaving
// the parameters and the optimizer's state untouched, and update() multiply the scale by backoff_factor.
// Otherwise each update() counts a clean iteration; after growth_interval consecutive ones the scale is
// multiplied by growth_factor (unless that overflows float32). The scale is a float32 value, as PyTorch's.
//
// Engines whose gradients are spread over several optimizers (DataParallel's DDP replicas, one optimizer
// each) use the lower-level pair: unscale_grads(grads) unscales one replica's gradients and returns its
// found_inf, the engine combines the flags (OR over replicas and processes), and record_unscaled(opt, flag)
// hands the combined flag to each optimizer before step(opt), so that all of them step or none does.
//
// Disabled (enabled = false): scale() returns the loss, unscale_ and update do nothing, step() always
// steps, get_scale() is 1: the same training loop runs with and without mixed precision.
// Thread-safety: scale() and unscale_grads() are const and may run on several threads at once (the DDP
// workers); unscale_, record_unscaled and step may run at once for different optimizers; update,
// load_state_dict and the setters run alone.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace dpe::optim {

// PyTorch's defaults. Each is validated at construction (the error names the value).
struct GradScalerOptions {
  double init_scale = 65536.0;    // 2^16; finite and > 0 once rounded to float32
  double growth_factor = 2.0;     // > 1 (finite)
  double backoff_factor = 0.5;    // in (0, 1)
  int64_t growth_interval = 2000;  // >= 1 clean iterations between growths
  bool enabled = true;
};

// What state_dict() returns and load_state_dict() takes, so that checkpoints can store it as numbers:
// "scale", "growth_factor", "backoff_factor", "growth_interval", "growth_tracker" (PyTorch's
// "_growth_tracker": clean iterations since the last growth or backoff).
using GradScalerStateDict = std::map<std::string, double>;

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;

  // loss x the current scale, differentiable (backward then gives scaled gradients); the loss itself when
  // disabled.
  Tensor scale(const Tensor& loss) const;

  // Unscales every gradient of `optimizer` in place and records whether one held an inf or NaN. Throws if it
  // was already unscaled (or stepped) since the last update(). Gradients must be float32 or float64; a
  // non-contiguous one is made contiguous first.
  void unscale_(Optimizer& optimizer);
  // Unscales `optimizer` unless unscale_ or record_unscaled already did this iteration, then runs
  // optimizer.step() unless an inf or NaN was found. Returns whether it stepped. Throws if `optimizer`
  // already stepped since the last update().
  bool step(Optimizer& optimizer);
  // Applies this iteration's outcome to the scale (see the file comment) and forgets the per-optimizer
  // records. Throws when no optimizer was unscaled or stepped since the last update (PyTorch's "No inf checks
  // were recorded prior to update").
  void update();

  // Lower level, for engines (see the file comment). unscale_grads: multiplies each defined gradient by
  // 1/scale in place and returns whether any held an inf or NaN before; it records nothing. `grads` must be
  // contiguous float32 or float64 tensors (on any devices; one flag per device, read back at the end).
  bool unscale_grads(const std::vector<Tensor>& grads) const;
  // The same for the gradients of `optimizer`'s parameters (a non-contiguous one is made contiguous first).
  bool unscale_grads(Optimizer& optimizer) const;
  // record_unscaled: `optimizer`'s gradients are unscaled and `found_inf` is the flag that decides its step
  // (combined over whatever must decide together). When `optimizer` was already unscaled this iteration (its
  // user called unscale_, e.g. to clip gradients), found_inf is OR-ed into the flag that unscale_ recorded.
  // Throws when `optimizer` already stepped since the last update().
  void record_unscaled(const Optimizer& optimizer, bool found_inf);
  // The flag recorded for `optimizer` this iteration (by unscale_ or record_unscaled); nullopt when it was not
  // unscaled yet.
  std::optional<bool> recorded_found_inf(const Optimizer& optimizer) const;
  // Forgets this iteration's per-optimizer records without touching the scale: for an engine whose step
  // failed halfway, so that the next iteration starts clean.
  void discard_records();

  double get_scale() const;  // 1 when disabled
  int64_t growth_tracker() const { return growth_tracker_; }
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  GradScalerStateDict state_dict() const;
  // Throws dpe::Error naming the key or value (a missing or unknown key, a value the options would refuse, a
  // growth_tracker that is not a whole number >= 0); nothing is modified then.
  void load_state_dict(const GradScalerStateDict& state);
  // The checks of load_state_dict alone, enabled or not (checkpoints validate a saved state when they are
  // loaded, before anything is modified).
  static void check_state_dict(const GradScalerStateDict& state);

 private:
  enum class Stage { Unscaled, Stepped };
  struct Record {
    Stage stage = Stage::Unscaled;
    bool found_inf = false;
  };
  // The gradients of `optimizer`'s parameters that have one, made contiguous.
  static std::vector<Tensor> gradients_of(Optimizer& optimizer);

  GradScalerOptions options_;
  double scale_;  // a float32 value
  int64_t growth_tracker_ = 0;
  mutable std::mutex mutex_;  // guards records_
  std::map<const Optimizer*, Record> records_;  // this iteration's, by optimizer
};

}  // namespace dpe::optim
