#include "engine/replica_set.h"

#include <algorithm>
#include <mutex>

#include "core/allocator.h"
#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/storage.h"
#include "engine/replica_error.h"
#include "engine/worker_pool.h"

namespace dpe {

namespace {

template <typename T>
void erase_at(std::vector<T>& v, size_t i) {
  v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
}

}  // namespace

void keep_forever(std::shared_ptr<void> object) {
  static auto* mutex = new std::mutex;
  static auto* kept = new std::vector<std::shared_ptr<void>>;
  if (!object) return;
  std::lock_guard lock(*mutex);
  kept->push_back(std::move(object));
}

ReplicaSet::ReplicaSet(std::vector<std::shared_ptr<nn::Module>> given, std::vector<Device> devices, int cpu_threads,
                       std::chrono::milliseconds timeout)
    : devices_(std::move(devices)), cpu_threads_(cpu_threads), timeout_(timeout) {
  DPE_INTERNAL_ASSERT(given.size() == 1 || given.size() == devices_.size(), given.size(), " modules for ",
                      devices_.size(), " devices");
  for (size_t r = 0; r < devices_.size(); ++r) {
    if (r == 0 || given.size() > 1) {
      replicas_.push_back(std::move(given[r]));
    } else {
      replicas_.push_back(replicas_[0]->clone(devices_[r]));
      ++replicas_created_;
    }
    std::vector<Tensor> state;
    for (auto& [name, t] : replicas_[r]->state_dict()) {
      state.push_back(t);
      if (r == 0) state_names_.push_back(name);
    }
    state_.push_back(std::move(state));
    buffers_.push_back(replicas_[r]->buffers());
    std::vector<Tensor> params;
    for (auto& [name, p] : replicas_[r]->named_parameters()) {
      params.push_back(p);
      if (r == 0) {
        param_names_.push_back(name);
        trainable_.push_back(p.requires_grad());
      }
    }
    params_.push_back(std::move(params));
    if (r == 0) check_master_placement();  // before cloning a misplaced master
    // The device's memory statistics count them as parameters (buffers too: the model's state).
    for (const Tensor& t : state_[r]) {
      if (t.defined() && t.storage()) t.storage()->set_memory_kind(MemoryKind::Parameters);
    }
  }
  pool_ = make_pool();
}

ReplicaSet::~ReplicaSet() {
  if (!pool_ || !pool_->has_lost_workers()) return;
  for (size_t r : pool_->lost_workers()) {
    if (r < replicas_.size()) keep_forever(replicas_[r]);
  }
}

std::unique_ptr<DeviceWorkerPool> ReplicaSet::make_pool() const {
  return std::make_unique<DeviceWorkerPool>(devices_, cpu_threads_, timeout_);
}

int64_t ReplicaSet::threads_created() const { return pool_->threads_created(); }

std::vector<std::vector<Tensor>> ReplicaSet::trainable_params() const {
  std::vector<std::vector<Tensor>> result(replicas_.size());
  for (size_t k = 0; k < trainable_.size(); ++k) {
    if (!trainable_[k]) continue;
    for (size_t r = 0; r < replicas_.size(); ++r) result[r].push_back(params_[r][k]);
  }
  return result;
}

std::vector<std::string> ReplicaSet::trainable_names() const {
  std::vector<std::string> names;
  for (size_t k = 0; k < trainable_.size(); ++k) {
    if (trainable_[k]) names.push_back(param_names_[k]);
  }
  return names;
}

// Note [Frozen parameters]
bool ReplicaSet::refresh_trainable() {
  bool changed = false;
  for (size_t k = 0; k < trainable_.size(); ++k) {
    const bool master = params_[0][k].requires_grad();
    changed = changed || master != trainable_[k];
    for (size_t r = 1; r < replicas_.size(); ++r) {
      const bool mine = params_[r][k].requires_grad();
      DPE_CHECK(mine == trainable_[k] || master != trainable_[k], "DataParallel: requires_grad of replica ", r,
                "'s '", param_names_[k], "' was set to ", mine ? "true" : "false", " but the master's (replica 0's) is ",
                master ? "true" : "false", "; change it on module() (replica 0): the engine copies the master's flags "
                "to every replica at the next step");
    }
  }
  if (!changed) return false;
  for (size_t k = 0; k < trainable_.size(); ++k) {
    trainable_[k] = params_[0][k].requires_grad();
    for (size_t r = 1; r < replicas_.size(); ++r) {
      params_[r][k].set_requires_grad(trainable_[k]);
    }
  }
  return true;
}

void ReplicaSet::check_master_placement() const {
  for (size_t k = 0; k < state_[0].size(); ++k) {
    const Device& d = state_[0][k].device();
    DPE_CHECK(d == devices_[0], "DataParallel: module must have its parameters and buffers on device_ids[0] = ",
              devices_[0], " but '", state_names_[k], "' is on ", d, "; move it with module->to(", devices_[0], ")");
  }
}

void ReplicaSet::verify_same_model() const {
  for (size_t r = 1; r < replicas_.size(); ++r) {
    DPE_CHECK(params_[r].size() == param_names_.size(), "DDP: replica ", r, " has ", params_[r].size(),
              " parameters, replica 0 has ", param_names_.size(), "; every replica must be the same model");
    nn::StateDict state = replicas_[r]->state_dict();
    DPE_CHECK(state.size() == state_names_.size(), "DDP: replica ", r, " has ", state.size(),
              " parameters and buffers, replica 0 has ", state_names_.size(), "; every replica must be the same model");
    for (size_t k = 0; k < state.size(); ++k) {
      const auto& [name, t] = state[k];
      const Tensor& reference = state_[0][k];
      DPE_CHECK(name == state_names_[k], "DDP: replica ", r, "'s tensor ", k, " is '", name, "', replica 0's is '",
                state_names_[k], "'");
      DPE_CHECK(t.shape() == reference.shape() && t.dtype() == reference.dtype(), "DDP: replica ", r, "'s '", name,
                "' is ", shape_str(t.shape()), " ", t.dtype(), ", replica 0's is ", shape_str(reference.shape()), " ",
                reference.dtype());
      DPE_CHECK(t.device() == devices_[r], "DDP: replica ", r, "'s '", name, "' is on ", t.device(),
                "; expected device_ids[", r, "] = ", devices_[r]);
    }
    for (size_t k = 0; k < param_names_.size(); ++k) {
      const bool mine = params_[r][k].requires_grad();
      DPE_CHECK(mine == trainable_[k], "DDP: replica ", r, "'s '", param_names_[k], "' has requires_grad ",
                mine ? "true" : "false", ", replica 0's has ", trainable_[k] ? "true" : "false",
                "; every replica must freeze the same parameters");
    }
  }
}

void ReplicaSet::run(const std::function<void(size_t)>& fn, ProcessGroup* group) {
  // The partners may be waiting for a failed replica inside a collective: wake them with the cause. Their
  // "aborted" errors come after it, so the pool reports the failed replica's own error.
  auto abort_group = [&](size_t r, const std::exception_ptr& error) {
    if (group) group->abort(replica_failure_reason(r, devices_[r], error));
  };
  try {
    pool_->run(devices_.size(), fn, abort_group);
  } catch (...) {
    // The group is reopened only when every worker's task has returned. A worker the pool declared lost (in
    // this run or an earlier one) may still be inside a collective of the group, or about to enter one: the
    // group stays aborted for good (ProcessGroup::reset refuses too while a member is inside, Note [A member
    // that leaves early] in collectives/process_group.cc), and dropping the device replaces it with a new
    // group while the lost thread keeps the old one alive (retire).
    if (group && !pool_->has_lost_workers()) group->reset();
    throw;
  }
}

void ReplicaSet::run(size_t count, const std::function<void(size_t)>& fn,
                     const std::function<void(size_t, const std::exception_ptr&)>& on_failure) {
  pool_->run(count, fn, on_failure);
}

TransferStats ReplicaSet::replicate(const std::vector<size_t>& to, size_t bucket_bytes) {
  if (to.empty()) return {};
  std::vector<std::vector<Tensor>> destinations;
  for (size_t r : to) destinations.push_back(state_[r]);
  return broadcast_coalesced_into(state_[0], destinations, bucket_bytes);
}

std::vector<size_t> ReplicaSet::lost_workers() const { return pool_->lost_workers(); }

bool ReplicaSet::pool_lost_workers() const { return pool_->has_lost_workers(); }

void ReplicaSet::retire(std::shared_ptr<void> object) const {
  if (lost_before_ || (pool_ && pool_->has_lost_workers())) keep_forever(std::move(object));
}

void ReplicaSet::drop(size_t r) {
  if (pool_->has_lost_workers()) {
    lost_before_ = true;
    for (size_t lost : pool_->lost_workers()) keep_forever(replicas_[lost]);
  }
  // The old pool first: its threads are idle (the failed task returned its exception) or lost (left behind),
  // so this joins the others.
  pool_.reset();
  erase_at(devices_, r);
  erase_at(replicas_, r);
  erase_at(state_, r);
  erase_at(buffers_, r);
  erase_at(params_, r);
  pool_ = make_pool();
}

}  // namespace dpe
