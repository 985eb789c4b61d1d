#include "engine/dp_reducer.h"

#include <algorithm>

#include "core/allocator.h"
#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/lost_thread.h"
#include "core/ops.h"

namespace dpe {

namespace {

bool all_cpu(const std::vector<Device>& devices) {
  return std::all_of(devices.begin(), devices.end(), [](const Device& d) { return d.is_cpu(); });
}

}  // namespace

DpReducer::DpReducer(std::vector<std::vector<Tensor>> replica_params, std::vector<Device> devices,
                                 size_t bucket_bytes, std::chrono::milliseconds timeout)
    : params_(std::move(replica_params)), bucket_bytes_(bucket_bytes) {
  DPE_CHECK(!params_.empty(), "DpReducer: no replicas");
  DPE_INTERNAL_ASSERT(devices.size() == params_.size(), devices.size(), " devices for ", params_.size(), " replicas");
  size_t n = params_[0].size();
  for (const auto& p : params_) DPE_INTERNAL_ASSERT(p.size() == n, "replicas differ in parameter count");
  if (devices.size() > 1 && all_cpu(devices)) {
    workers_ = std::make_shared<ProcessGroup>(std::move(devices), ProcessGroupOptions{.timeout = timeout});
  }
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

DpReducer::~DpReducer() = default;

void DpReducer::prepare(size_t used) {
  DPE_INTERNAL_ASSERT(used >= 1 && used <= params_.size());
  used_ = used;
  shares_ = workers_ && used == params_.size();
  // After a failed step. Every worker's task has returned, unless the pool declared one lost: then this group
  // may never be reset (reset() refuses while a member is inside reduce_share's barrier), and a lost worker
  // takes part in no later step (the pool refuses it; dropping its device builds a new reducer).
  if (workers_) workers_->reset();
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

void DpReducer::on_gradient_ready(size_t replica, size_t param) {
  // Not armed, or an unused replica: a backward the engine does not manage. In shares, reduce_share adds them.
  if (!armed_.load() || shares_ || replica >= used_) return;
  size_t b = bucket_of_[param];
  if (pending_[b]->fetch_sub(1) == 1) {
    reduce_bucket(b);
    std::lock_guard lock(stats_mutex_);
    ++reduced_early_;
  }
}

bool DpReducer::in_shares(size_t param) const {
  const Tensor& master = params_[0][param].grad();
  if (!master.defined() || !master.is_contiguous()) return false;
  for (size_t r = 1; r < used_; ++r) {
    const Tensor& g = params_[r][param].grad();
    if (!g.defined() || !g.is_contiguous() || g.dtype() != master.dtype()) return false;
  }
  return true;
}

void DpReducer::reduce_share(size_t replica) {
  if (!shares_) return;
  // After the barrier every used replica's backward has finished: its gradients are final.
  workers_->barrier(static_cast<int>(replica));
  checkpoint_if_lost();  // a worker declared lost while it waited writes nothing (core/lost_thread.h)
  NoGradGuard no_grad;
  for (size_t p = 0; p < params_[0].size(); ++p) {
    if (!in_shares(p)) continue;
    Tensor master = params_[0][p].grad().view({-1});
    // An even split, on 64-byte lines: no two workers write one cache line.
    auto [begin, end] = collectives::work_range(master.numel(), element_size(master.dtype()), static_cast<int>(used_),
                                                static_cast<int>(replica), {});
    if (begin == end) continue;
    Tensor mine = master.narrow(0, begin, end - begin);
    for (size_t r = 1; r < used_; ++r) mine.add_(params_[r][p].grad().view({-1}).narrow(0, begin, end - begin));
  }
}

void DpReducer::abort_shares(const std::string& reason) noexcept {
  if (workers_) workers_->abort(reason);
}

std::vector<int> DpReducer::missing_at_last_timeout() const {
  return workers_ ? workers_->missing_at_last_timeout() : std::vector<int>{};
}

void DpReducer::reduce_bucket(size_t b) {
  if (reduced_[b]->exchange(true)) return;
  reduce_params(buckets_[b]);
}

void DpReducer::reduce_params(const std::vector<size_t>& params) {
  if (used_ == 1) return;  // nothing to add: the master's gradient is the whole gradient
  NoGradGuard no_grad;
  std::vector<Tensor> outputs;
  std::vector<std::vector<Tensor>> inputs(used_ - 1);
  for (size_t p : params) {
    const Tensor& master = params_[0][p];
    bool any = master.grad().defined();
    for (size_t r = 1; r < used_; ++r) any = any || params_[r][p].grad().defined();
    if (!any) continue;  // unused everywhere: stays undefined, like PyTorch
    if (!master.grad().defined()) {
      MemoryKindGuard kind(MemoryKind::Gradients);
      master.set_grad(zeros(master.shape(), TensorOptions(master.dtype()).with_device(master.device())));
    }
    outputs.push_back(master.grad());
    for (size_t r = 1; r < used_; ++r) inputs[r - 1].push_back(params_[r][p].grad());
  }
  if (outputs.empty()) return;
  TransferStats stats = reduce_add_coalesced_into(inputs, outputs, bucket_bytes_, ReduceInto::Accumulate);
  std::lock_guard lock(stats_mutex_);
  stats_ += stats;
}

TransferStats DpReducer::finish() {
  if (shares_ && armed_.load()) {
    // The workers reduced these in shares (reduce_share); count them as reduce_add_coalesced_into would.
    std::vector<size_t> rest;
    for (size_t p = 0; p < params_[0].size(); ++p) {
      if (!in_shares(p)) {
        rest.push_back(p);
        continue;
      }
      for (size_t r = 1; r < used_; ++r) {
        stats_.transfers += 1;
        stats_.bytes += static_cast<int64_t>(params_[r][p].grad().nbytes());
      }
    }
    reduce_params(rest);
    reduced_early_ = static_cast<int64_t>(buckets_.size());
  } else {
    for (size_t b = 0; b < buckets_.size(); ++b) reduce_bucket(b);
  }
  armed_.store(false);
  return stats_;
}

}  // namespace dpe
