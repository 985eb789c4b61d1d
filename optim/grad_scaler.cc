#include "optim/grad_scaler.h"

#include <cmath>
#include <limits>
#include <utility>

#include "core/dispatch.h"
#include "core/error.h"
#include "core/kernels/amp.h"
#include "core/ops.h"

namespace dpe::optim {
namespace {

// PyTorch keeps the scale in a float32 tensor: every value it takes is rounded to float32.
double as_float32(double v) { return static_cast<double>(static_cast<float>(v)); }

bool is_whole(double v) { return std::isfinite(v) && std::floor(v) == v; }

void check_options(double init_scale, double growth_factor, double backoff_factor, double growth_interval) {
  const double scale = as_float32(init_scale);
  DPE_CHECK(std::isfinite(scale) && scale > 0, "GradScaler: init_scale must be finite and > 0 as a float32, got ",
            init_scale);
  DPE_CHECK(std::isfinite(growth_factor) && growth_factor > 1, "GradScaler: growth_factor must be > 1, got ",
            growth_factor);
  DPE_CHECK(backoff_factor > 0 && backoff_factor < 1, "GradScaler: backoff_factor must be in (0, 1), got ",
            backoff_factor);
  DPE_CHECK(is_whole(growth_interval) && growth_interval >= 1,
            "GradScaler: growth_interval must be a whole number >= 1, got ", growth_interval);
}

const char* const kStateKeys[] = {"scale", "growth_factor", "backoff_factor", "growth_interval", "growth_tracker"};

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  check_options(options.init_scale, options.growth_factor, options.backoff_factor,
                static_cast<double>(options.growth_interval));
  scale_ = as_float32(options.init_scale);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  DPE_CHECK(loss.defined(), "GradScaler::scale: the loss is an undefined tensor");
  if (!options_.enabled) return loss;
  return mul(loss, scale_);
}

double GradScaler::get_scale() const { return options_.enabled ? scale_ : 1.0; }

std::vector<Tensor> GradScaler::gradients_of(Optimizer& optimizer) {
  std::vector<Tensor> grads;
  for (const ParamGroup& group : optimizer.param_groups()) {
    for (const Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      if (!p.grad().is_contiguous()) p.set_grad(p.grad().contiguous());
      grads.push_back(p.grad());
    }
  }
  return grads;
}

bool GradScaler::unscale_grads(const std::vector<Tensor>& grads) const {
  // PyTorch: inv_scale = scale.double().reciprocal().float().
  const float inv_scale = static_cast<float>(1.0 / scale_);
  // One flag per device, written by the kernels on that device's stream and read back once at the end.
  std::vector<std::pair<Device, Tensor>> flags;
  auto flag_on = [&](const Device& device) -> float* {
    for (auto& [d, flag] : flags) {
      if (d == device) return static_cast<float*>(flag.data_ptr());
    }
    flags.emplace_back(device, zeros({1}, TensorOptions(DType::Float32).with_device(device)));
    return static_cast<float*>(flags.back().second.data_ptr());
  };
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined()) continue;
    DPE_CHECK(g.dtype() == DType::Float32 || g.dtype() == DType::Float64, "GradScaler: gradient ", i, " ",
              shape_str(g.shape()), " is ", g.dtype(), "; unscaling takes float32 or float64 gradients");
    DPE_CHECK(g.is_contiguous(), "GradScaler: gradient ", i, " ", shape_str(g.shape()), " is not contiguous");
    float* found = flag_on(g.device());
    dispatch(
        g.device(), [&] { kernels::amp_unscale_cpu(g.dtype(), g.numel(), g.data_ptr(), inv_scale, found); },
        [&](auto stream) {
          kernels::amp_unscale_cuda(stream, g.dtype(), g.numel(), g.data_ptr(), inv_scale, found);
        });
  }
  bool found_inf = false;
  for (const auto& [device, flag] : flags) found_inf = found_inf || flag.item() != 0.0;
  return found_inf;
}

bool GradScaler::unscale_grads(Optimizer& optimizer) const { return unscale_grads(gradients_of(optimizer)); }

void GradScaler::record_unscaled(const Optimizer& optimizer, bool found_inf) {
  if (!options_.enabled) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, inserted] = records_.try_emplace(&optimizer, Record{Stage::Unscaled, found_inf});
  if (inserted) return;
  DPE_CHECK(it->second.stage != Stage::Stepped, "GradScaler: record_unscaled() after step() on this optimizer; "
            "call update() first");
  it->second.found_inf = it->second.found_inf || found_inf;
}

std::optional<bool> GradScaler::recorded_found_inf(const Optimizer& optimizer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = records_.find(&optimizer);
  if (it == records_.end()) return std::nullopt;
  return it->second.found_inf;
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!options_.enabled) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = records_.find(&optimizer);
    DPE_CHECK(it == records_.end(), it->second.stage == Stage::Stepped
                                        ? "GradScaler: unscale_() is being called after step() on this optimizer; "
                                          "call update() first"
                                        : "GradScaler: unscale_() has already been called on this optimizer since "
                                          "the last update()");
  }
  const bool found_inf = unscale_grads(optimizer);
  std::lock_guard<std::mutex> lock(mutex_);
  records_[&optimizer] = Record{Stage::Unscaled, found_inf};
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  bool recorded = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = records_.find(&optimizer);
    if (it != records_.end()) {
      DPE_CHECK(it->second.stage != Stage::Stepped, "GradScaler: step() has already been called on this optimizer "
                "since the last update()");
      recorded = true;
    }
  }
  if (!recorded) unscale_(optimizer);
  bool found_inf = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Record& record = records_.at(&optimizer);
    record.stage = Stage::Stepped;
    found_inf = record.found_inf;
  }
  if (found_inf) return false;  // the parameters and the optimizer's state stay as they are
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  std::lock_guard<std::mutex> lock(mutex_);
  DPE_CHECK(!records_.empty(), "GradScaler::update: no inf checks were recorded since the last update; call "
            "step() (or unscale_()) on an optimizer first");
  bool found_inf = false;
  for (const auto& [optimizer, record] : records_) found_inf = found_inf || record.found_inf;
  records_.clear();
  // PyTorch's _amp_update_scale_.
  if (found_inf) {
    scale_ = as_float32(scale_ * options_.backoff_factor);
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ < options_.growth_interval) return;
  const double grown = as_float32(scale_ * options_.growth_factor);
  if (std::isfinite(grown)) scale_ = grown;  // a scale that overflows float32 stays where it is
  growth_tracker_ = 0;
}

void GradScaler::discard_records() {
  std::lock_guard<std::mutex> lock(mutex_);
  records_.clear();
}

GradScalerStateDict GradScaler::state_dict() const {
  if (!options_.enabled) return {};  // PyTorch's: a disabled scaler has no state
  return {{"scale", scale_},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", static_cast<double>(options_.growth_interval)},
          {"growth_tracker", static_cast<double>(growth_tracker_)}};
}

void GradScaler::check_state_dict(const GradScalerStateDict& state) {
  DPE_CHECK(!state.empty(), "GradScaler::load_state_dict: the state is empty, possibly because it was saved "
            "from a disabled GradScaler");
  for (const char* key : kStateKeys) {
    DPE_CHECK(state.count(key) == 1, "GradScaler::load_state_dict: the state has no '", key, "'");
  }
  for (const auto& [key, value] : state) {
    bool known = false;
    for (const char* k : kStateKeys) known = known || key == k;
    DPE_CHECK(known, "GradScaler::load_state_dict: unknown key '", key, "'");
  }
  const double scale = state.at("scale"), tracker = state.at("growth_tracker");
  DPE_CHECK(std::isfinite(as_float32(scale)) && as_float32(scale) > 0, "GradScaler::load_state_dict: scale must be "
            "finite and > 0 as a float32, got ", scale);
  check_options(scale, state.at("growth_factor"), state.at("backoff_factor"), state.at("growth_interval"));
  DPE_CHECK(is_whole(tracker) && tracker >= 0, "GradScaler::load_state_dict: growth_tracker must be a whole "
            "number >= 0, got ", tracker);
  // Both become int64_t: a count beyond 2^53 is not a count a run reaches (and 1e300 would not convert).
  constexpr double kMaxCount = 9007199254740992.0;
  DPE_CHECK(tracker <= kMaxCount && state.at("growth_interval") <= kMaxCount, "GradScaler::load_state_dict: ",
            tracker > kMaxCount ? "growth_tracker " : "growth_interval ",
            tracker > kMaxCount ? tracker : state.at("growth_interval"), " is above 2^53; expected a count");
}

void GradScaler::load_state_dict(const GradScalerStateDict& state) {
  if (!options_.enabled) return;  // PyTorch's: nothing to load into
  check_state_dict(state);
  const double scale = state.at("scale"), tracker = state.at("growth_tracker");
  options_.growth_factor = state.at("growth_factor");
  options_.backoff_factor = state.at("backoff_factor");
  options_.growth_interval = static_cast<int64_t>(state.at("growth_interval"));
  scale_ = as_float32(scale);
  growth_tracker_ = static_cast<int64_t>(tracker);
}

}  // namespace dpe::optim
