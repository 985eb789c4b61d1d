// A post-accumulate-grad hook on every parameter of every replica, removed when this goes away: what both
// gradient reducers (DP's DpReducer, DDP's DdpReducer) listen to. Internal to engine/.
//
// Ownership: the reducer that owns this must declare it as its last member, so that the hooks (which call
// back into the reducer) are removed before the rest of the reducer is destroyed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace dpe::detail {

class ReplicaGradientHooks {
 public:
  // on_ready(r, p) runs (on the thread running that backward) once parameter p of replica r has its
  // gradient accumulated.
  ReplicaGradientHooks(std::vector<std::vector<Tensor>> params, std::function<void(size_t, size_t)> on_ready)
      : params_(std::move(params)) {
    for (size_t r = 0; r < params_.size(); ++r) {
      handles_.emplace_back();
      for (size_t p = 0; p < params_[r].size(); ++p) {
        handles_[r].push_back(params_[r][p].register_post_accumulate_grad_hook(
            [on_ready, r, p](const Tensor&) { on_ready(r, p); }));
      }
    }
  }
  ~ReplicaGradientHooks() {
    for (size_t r = 0; r < params_.size(); ++r) {
      for (size_t p = 0; p < params_[r].size(); ++p) params_[r][p].remove_post_accumulate_grad_hook(handles_[r][p]);
    }
  }
  ReplicaGradientHooks(const ReplicaGradientHooks&) = delete;
  ReplicaGradientHooks& operator=(const ReplicaGradientHooks&) = delete;

 private:
  std::vector<std::vector<Tensor>> params_;
  std::vector<std::vector<int64_t>> handles_;
};

}  // namespace dpe::detail
