// DataParallel's DDP mode: construction (structure check, broadcast from replica 0, process group, reducer)
// and the DDP step. The DP step is in dp_mode.cc, what both modes construct in data_parallel.cc, the step API
// they share in train_step.cc.
#include <algorithm>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/lost_thread.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "engine/ddp_reducer.h"
#include "engine/gradient_reducer.h"
#include "engine/replica_error.h"
#include "engine/worker_pool.h"
#include "engine/timing.h"
#include "layers/sync_batchnorm.h"

namespace dpe {

using detail::Clock;
using detail::ms_since;

void DataParallel::verify_replica_structure() const {
  for (size_t r = 1; r < replicas_.size(); ++r) {
    DPE_CHECK(replica_params_[r].size() == param_names_.size(), "DDP: replica ", r, " has ",
              replica_params_[r].size(), " parameters, replica 0 has ", param_names_.size(),
              "; every replica must be the same model");
    nn::StateDict state = replicas_[r]->state_dict();
    DPE_CHECK(state.size() == state_names_.size(), "DDP: replica ", r, " has ", state.size(),
              " parameters and buffers, replica 0 has ", state_names_.size(), "; every replica must be the same model");
    for (size_t k = 0; k < state.size(); ++k) {
      const auto& [name, t] = state[k];
      const Tensor& reference = replica_state_[0][k];
      DPE_CHECK(name == state_names_[k], "DDP: replica ", r, "'s tensor ", k, " is '", name, "', replica 0's is '",
                state_names_[k], "'");
      DPE_CHECK(t.shape() == reference.shape() && t.dtype() == reference.dtype(), "DDP: replica ", r, "'s '", name,
                "' is ", shape_str(t.shape()), " ", t.dtype(), ", replica 0's is ", shape_str(reference.shape()), " ",
                reference.dtype());
      DPE_CHECK(t.device() == device_ids_[r], "DDP: replica ", r, "'s '", name, "' is on ", t.device(),
                "; expected device_ids[", r, "] = ", device_ids_[r]);
    }
    for (size_t k = 0; k < param_names_.size(); ++k) {
      const bool mine = replica_params_[r][k].requires_grad();
      DPE_CHECK(mine == trainable_[k], "DDP: replica ", r, "'s '", param_names_[k], "' has requires_grad ",
                mine ? "true" : "false", ", replica 0's has ", trainable_[k] ? "true" : "false",
                "; every replica must freeze the same parameters");
    }
  }
}

void DataParallel::init_ddp() {
  DPE_CHECK(!options_.bucket_cap_mb.has_value() || *options_.bucket_cap_mb > 0, "DDP: bucket_cap_mb must be positive, got ",
            options_.bucket_cap_mb.value_or(0));
  verify_replica_structure();
  retire(std::move(group_));
  group_ = std::make_shared<ProcessGroup>(device_ids_, ProcessGroupOptions{options_.backend, options_.timeout});
  if (group_->world_size() > group_->size()) verify_structure_across_processes(*group_);
  // PyTorch's _sync_module_states: replica 0's parameters and buffers, broadcast to every replica.
  run_replicas([&](size_t r) {
    NoGradGuard no_grad;
    for (const Tensor& t : replica_state_[r]) group_->broadcast(static_cast<int>(r), t, 0);
  });
  connect_replicas();
}

void DataParallel::connect_replicas() {
  if (!group_ || group_->size() != static_cast<int>(device_ids_.size())) {
    retire(std::move(group_));
    group_ = std::make_shared<ProcessGroup>(device_ids_, ProcessGroupOptions{options_.backend, options_.timeout});
  }
  if (auto_split_) group_->set_work_shares(auto_split_->weights());  // see observe_split
  // The deterministic mode's BatchNorm statistics are per virtual shard: SyncBatchNorm stays unsynchronised.
  for (size_t r = 0; r < replicas_.size(); ++r) {
    sync_batchnorm_layers_ = nn::set_sync_batchnorm_group(*replicas_[r], options_.deterministic ? nullptr : group_,
                                                          static_cast<int>(r));
  }
}

void DataParallel::run_replicas(const std::function<void(size_t)>& fn) {
  // The partners may be waiting for a failed replica inside a collective: wake them with the cause. Their
  // "aborted" errors come after it, so the pool reports the failed replica's own error.
  auto abort_group = [&](size_t r, const std::exception_ptr& error) {
    if (group_) group_->abort(replica_failure_reason(r, device_ids_[r], error));
  };
  try {
    pool_->run(device_ids_.size(), fn, abort_group);
  } catch (...) {
    // The group is reopened only when every worker's task has returned. A worker the pool declared lost (in
    // this run or an earlier one) may still be inside a collective of the group, or about to enter one: the
    // group stays aborted for good (ProcessGroup::reset refuses too while a member is inside, Note [A member
    // that leaves early] in collectives/process_group.cc), and dropping the device replaces it with a new
    // group while the lost thread keeps the old one alive (drop_device, abandon_to_lost_workers).
    if (group_ && !pool_->has_lost_workers()) group_->reset();
    throw;
  }
}

double DataParallel::forward_backward_ddp(const Tensor& input, const Tensor& target, const LossFn& loss_fn) {
  const size_t n = device_ids_.size();
  int64_t dim = 0;
  const int64_t batch = step_batch(input, target, &dim);
  const bool across_processes = group_->world_size() > group_->size();
  // Across processes another process may have the samples; in one, an empty batch has no loss.
  DPE_CHECK(batch > 0 || across_processes, "DataParallel::forward_backward: the batch is empty (0 samples along "
            "dim ", dim, "); expected at least one");
  // A device past the batch's chunks gets no sample (PyTorch's uneven-inputs problem, solved here): its
  // replica runs no forward or backward, contributes zeros with weight 0, and still takes part in every
  // collective, so the other replicas' gradients are the batch's mean and every replica steps alike.
  std::vector<int64_t> sizes = chunk_sizes(batch);
  sizes.resize(n, 0);
  const size_t empty = static_cast<size_t>(std::count(sizes.begin(), sizes.end(), int64_t{0}));
  DPE_CHECK(empty == 0 || sync_batchnorm_layers_ == 0, "DataParallel (DDP mode): a batch of ", batch, " leaves ",
            empty, " of ", n, " devices without a sample, and the model's SyncBatchNorm layers need one on every "
            "replica; use a batch of at least ", n);
  report_.chunk_sizes = sizes;
  report_.used_devices.clear();
  for (size_t r = 0; r < n; ++r) {
    if (sizes[r] > 0) report_.used_devices.push_back(device_ids_[r]);
  }
  std::vector<int64_t> offsets(n, 0);
  for (size_t r = 1; r < n; ++r) offsets[r] = offsets[r - 1] + sizes[r - 1];

  refresh_trainable();
  const bool sync = require_backward_grad_sync_;
  if (sync) ddp_reducer_->prepare_for_backward();
  auto allreduces = [&] { return group_->calls(Collective::AllReduce) + group_->calls(Collective::AllReduceInto); };
  const int64_t allreduces_before = allreduces();
  std::vector<double> scatter_ms(n), broadcast_ms(n), forward_ms(n), loss_ms(n), backward_ms(n), losses(n);
  std::vector<int64_t> scatter_bytes(n, 0), broadcast_bytes(n, 0);
  std::vector<double> global_loss(n), arrived_ms(n, 0.0);
  const auto step_start = Clock::now();
  try {
    run_replicas([&](size_t r) {
      const int rank = static_cast<int>(r);
      auto start = Clock::now();
      // non_blocking: from a pinned batch the copies to a CUDA device are only enqueued (as DP's scatter).
      Tensor x = input.narrow(dim, offsets[r], sizes[r]).to(device_ids_[r], /*non_blocking=*/true).contiguous();
      Tensor y = target.narrow(dim, offsets[r], sizes[r]).to(device_ids_[r], /*non_blocking=*/true).contiguous();
      if (input.device() != device_ids_[r]) scatter_bytes[r] += static_cast<int64_t>(x.nbytes() + y.nbytes());
      scatter_ms[r] = ms_since(start);

      start = Clock::now();
      if (options_.broadcast_buffers && sync) {
        NoGradGuard no_grad;
        for (const Tensor& b : replica_buffers_[r]) {
          group_->broadcast(rank, b, 0);
          if (r != 0) broadcast_bytes[r] += static_cast<int64_t>(b.nbytes());
        }
      }
      broadcast_ms[r] = ms_since(start);

      if (sync) {
        // Each replica's gradient weighs its share of the global batch (n_r / N), so that uneven shards still
        // give the global batch's mean gradient (PyTorch averages the replicas' means instead); for even
        // shards the weight is exactly 1 / world size, PyTorch's.
        const double global_batch = across_processes ? samples_over_processes(*group_, rank, sizes[r]) : batch;
        ddp_reducer_->set_gradient_weight(r, static_cast<double>(sizes[r]) / global_batch);
        ddp_reducer_->attach_gradients(r);
      }
      if (sizes[r] == 0) {
        if (sync) {
          ddp_reducer_->contribute_nothing(r);
          ddp_reducer_->finalize_backward(r);
          if (across_processes) global_loss[r] = loss_over_processes(*group_, rank, 0.0, 0);
        }
        return;
      }
      start = Clock::now();
      // checkpoint_if_lost: before each write into this frame (core/lost_thread.h).
      Tensor out = replicas_[r]->forward(x);
      checkpoint_if_lost();
      forward_ms[r] = ms_since(start);
      start = Clock::now();
      Tensor loss = checked_loss(loss_fn, out, y);
      checkpoint_if_lost();
      loss_ms[r] = ms_since(start);

      start = Clock::now();
      const Tensor root = backward_root(loss);  // loss x scale with a grad scaler
      if (sync) ddp_reducer_->mark_unused_parameters(r, root);
      root.backward();
      if (sync) ddp_reducer_->finalize_backward(r);
      checkpoint_if_lost();
      backward_ms[r] = ms_since(start);
      // Note [What the auto split measures]: until the replica began waiting in its last collective.
      const std::optional<Clock::time_point> arrived = sync ? ddp_reducer_->entered_last_collective(r) : std::nullopt;
      arrived_ms[r] = std::chrono::duration<double, std::milli>(arrived.value_or(Clock::now()) - step_start).count();
      const double value = loss.item();  // a CUDA device waits for the step here
      checkpoint_if_lost();
      losses[r] = value;
      if (across_processes && sync) global_loss[r] = loss_over_processes(*group_, rank, losses[r], sizes[r]);
    });
  } catch (...) {
    ddp_reducer_->disarm();
    throw;
  }
  ddp_reducer_->disarm();

  auto slowest = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  report_.scatter_ms = slowest(scatter_ms);
  report_.broadcast_ms = slowest(broadcast_ms);
  report_.forward_ms = slowest(forward_ms);
  report_.loss_ms = slowest(loss_ms);
  report_.backward_ms = slowest(backward_ms);
  for (size_t r = 0; r < n; ++r) {
    report_.scatter.bytes += scatter_bytes[r];
    report_.broadcast.bytes += broadcast_bytes[r];
  }
  report_.buckets = static_cast<int64_t>(ddp_reducer_->num_buckets());
  if (sync) {
    for (size_t r = 0; r < n; ++r) report_.reduce_ms = std::max(report_.reduce_ms, ddp_reducer_->allreduce_ms(r));
    report_.reduce.bytes = ddp_reducer_->allreduce_bytes() * static_cast<int64_t>(n);
    report_.buckets_reduced_during_backward = ddp_reducer_->launched_during_backward() / static_cast<int64_t>(n);
  }
  report_.reduce.transfers = allreduces() - allreduces_before;
  report_.device_compute_ms = arrived_ms;
  if (across_processes && sync) return global_loss[0];
  double total = 0;
  for (size_t r = 0; r < n; ++r) total += losses[r] * static_cast<double>(sizes[r]);
  return total / static_cast<double>(batch);
}

}  // namespace dpe
