#include "engine/gradient_reducer.h"

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"

namespace dpe {

GradientReducer::GradientReducer(std::vector<std::vector<Tensor>> replica_params, size_t bucket_bytes)
    : params_(std::move(replica_params)), bucket_bytes_(bucket_bytes) {
  DPE_CHECK(!params_.empty(), "GradientReducer: no replicas");
  size_t n = params_[0].size();
  for (const auto& p : params_) DPE_INTERNAL_ASSERT(p.size() == n, "replicas differ in parameter count");
  // Buckets over the master's parameters in reverse registration order: gradients become ready roughly
  // in reverse order of use, so the first bucket completes first.
  std::vector<Tensor> reversed(params_[0].rbegin(), params_[0].rend());
  bucket_of_.assign(n, 0);
  for (auto [first, last] : plan_buckets(reversed, bucket_bytes_)) {
    std::vector<size_t> bucket;
    for (size_t i = first; i < last; ++i) {
      size_t param = n - 1 - i;
      bucket.push_back(param);
      bucket_of_[param] = buckets_.size();
    }
    buckets_.push_back(bucket);
    pending_.push_back(std::make_unique<std::atomic<int64_t>>(0));
    reduced_.push_back(std::make_unique<std::atomic<bool>>(true));
  }
  hooks_ = std::make_unique<detail::ReplicaGradientHooks>(
      params_, [this](size_t r, size_t p) { on_gradient_ready(r, p); });
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::prepare(size_t used) {
  DPE_INTERNAL_ASSERT(used >= 1 && used <= params_.size());
  used_ = used;
  for (size_t r = 1; r < params_.size(); ++r) {
    for (Tensor& p : params_[r]) p.set_grad({});
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b]->store(static_cast<int64_t>(buckets_[b].size() * used));
    reduced_[b]->store(false);
  }
  stats_ = {};
  reduced_early_ = 0;
  armed_.store(true);
}

void GradientReducer::on_gradient_ready(size_t replica, size_t param) {
  if (!armed_.load() || replica >= used_) return;  // a backward the engine does not manage
  size_t b = bucket_of_[param];
  if (pending_[b]->fetch_sub(1) == 1) {
    reduce_bucket(b);
    std::lock_guard lock(stats_mutex_);
    ++reduced_early_;
  }
}

void GradientReducer::reduce_bucket(size_t b) {
  if (reduced_[b]->exchange(true)) return;
  if (used_ == 1) return;  // nothing to add: the master's gradient is the whole gradient
  NoGradGuard no_grad;
  std::vector<Tensor> outputs;
  std::vector<std::vector<Tensor>> inputs(used_ - 1);
  for (size_t p : buckets_[b]) {
    const Tensor& master = params_[0][p];
    bool any = master.grad().defined();
    for (size_t r = 1; r < used_; ++r) any = any || params_[r][p].grad().defined();
    if (!any) continue;  // unused everywhere: stays undefined, like PyTorch
    if (!master.grad().defined()) master.set_grad(zeros(master.shape(), TensorOptions(master.dtype()).with_device(master.device())));
    outputs.push_back(master.grad());
    for (size_t r = 1; r < used_; ++r) inputs[r - 1].push_back(params_[r][p].grad());
  }
  if (outputs.empty()) return;
  TransferStats stats = reduce_add_coalesced_into(inputs, outputs, bucket_bytes_, ReduceInto::Accumulate);
  std::lock_guard lock(stats_mutex_);
  stats_ += stats;
}

TransferStats GradientReducer::finish() {
  for (size_t b = 0; b < buckets_.size(); ++b) reduce_bucket(b);
  armed_.store(false);
  return stats_;
}

}  // namespace dpe
