#include "engine/ddp_step.h"

#include <algorithm>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/lost_thread.h"
#include "engine/across_processes.h"
#include "engine/ddp_reducer.h"
#include "engine/dp_step.h"
#include "engine/loss_scaling.h"
#include "engine/timing.h"
#include "layers/sync_batchnorm.h"

namespace dpe {

using detail::Clock;
using detail::ms_since;

// One step's shards and what each replica measured while running its own (index: replica).
struct DdpStep::Shards {
  Shards(int64_t dim, std::vector<int64_t> sizes, size_t n) : rows(dim, std::move(sizes)), times(n), bytes(n) {}
  BatchShards rows;
  Tensor input, target;
  int64_t batch = 0;
  bool across_processes = false, sync = true;
  Clock::time_point start;
  struct Times {
    double scatter = 0, broadcast = 0, forward = 0, loss = 0, backward = 0, arrived = 0;
  };
  struct Bytes {
    int64_t scatter = 0, broadcast = 0;
  };
  std::vector<Times> times;
  std::vector<Bytes> bytes;
  std::vector<double> losses = std::vector<double>(times.size(), 0.0);
  std::vector<double> global_loss = losses;  // across processes: the mean over every process's batch
};

DdpStep::DdpStep(StepContext& ctx) : Step(ctx) {
  ReplicaSet& replicas = *ctx_.replicas;
  replicas.verify_same_model();
  group_ = std::make_shared<ProcessGroup>(replicas.devices(),
                                          ProcessGroupOptions{ctx_.options.backend, ctx_.options.timeout});
  try {
    if (group_->world_size() > group_->size()) {
      verify_structure_across_processes(*group_, replicas, "DDP", [&](const std::function<void(size_t)>& fn) {
        replicas.run(fn, group_.get());
      });
    }
    // PyTorch's _sync_module_states: replica 0's parameters and buffers, broadcast to every replica.
    replicas.run([&](size_t r) {
      NoGradGuard no_grad;
      for (const Tensor& t : replicas.state(r)) group_->broadcast(static_cast<int>(r), t, 0);
    }, group_.get());
    connect_replicas();
    build_reducer();
  } catch (...) {
    // No destructor runs for a constructor that throws: a worker lost in the broadcast may still be inside
    // the group (Note [Lost workers] in engine/worker_pool.cc).
    replicas.retire(group_);
    throw;
  }
}

DdpStep::~DdpStep() {
  ReplicaSet& replicas = *ctx_.replicas;
  // What a lost worker may still reach is kept (its hooks stay disarmed); the rest goes. The SyncBatchNorm
  // layers leave the group, unless a lost worker may still be running one of them.
  replicas.retire(std::shared_ptr<DdpReducer>(std::move(reducer_)));
  if (!replicas.pool_lost_workers()) {
    for (size_t r = 0; r < replicas.size(); ++r) {
      nn::set_sync_batchnorm_group(replicas.replica(r), nullptr, static_cast<int>(r));
    }
  }
  replicas.retire(std::move(group_));
}

void DdpStep::connect_replicas() {
  split_changed();
  // The deterministic mode's BatchNorm statistics are per virtual shard: SyncBatchNorm stays unsynchronised.
  ReplicaSet& replicas = *ctx_.replicas;
  for (size_t r = 0; r < replicas.size(); ++r) {
    sync_batchnorm_layers_ = nn::set_sync_batchnorm_group(replicas.replica(r), ctx_.options.deterministic ? nullptr : group_,
                                                          static_cast<int>(r));
  }
}

// DDP's all-reduce follows the auto split too: each member reduces a part of every bucket proportional to its
// device's speed (ProcessGroup::set_work_shares), or the slow devices would still do an equal part.
void DdpStep::split_changed() {
  if (const std::vector<double>* weights = ctx_.split->auto_weights()) group_->set_work_shares(*weights);
}

void DdpStep::build_reducer() {
  DdpReducerOptions options{.find_unused_parameters = ctx_.options.find_unused_parameters,
                            .reduce_dtype = ctx_.options.reduce_dtype,
                            .zero = ctx_.options.zero_stage > 0,
                            .shard_gradients = ctx_.options.zero_stage == 2};
  if (ctx_.options.bucket_cap_mb.has_value()) {
    options.bucket_cap_bytes = static_cast<size_t>(*ctx_.options.bucket_cap_mb * 1024 * 1024);
    options.first_bucket_bytes = options.bucket_cap_bytes;
  }
  // Its hooks go before the new reducer's are registered (kept for a lost worker, they stay disarmed).
  ctx_.replicas->retire(std::shared_ptr<DdpReducer>(std::move(reducer_)));
  reducer_ = std::make_unique<DdpReducer>(ctx_.replicas->trainable_params(), ctx_.replicas->trainable_names(), group_,
                                          options);
}

void DdpStep::trainable_changed() { build_reducer(); }

void DdpStep::optimizers_made() {
  if (group_->world_size() == group_->size() || ctx_.optimizers.empty()) return;
  verify_optimizer_across_processes(*group_, *ctx_.optimizers[0], "DDP", [&](const std::function<void(size_t)>& fn) {
    ctx_.replicas->run(fn, group_.get());
  });
}

void DdpStep::replica_dropped(size_t r) {
  ReplicaSet& replicas = *ctx_.replicas;
  replicas.retire(std::shared_ptr<DdpReducer>(std::move(reducer_)));
  // The group loses the member (NCCL: ncclCommShrink, which also ends what it left in flight).
  std::shared_ptr<ProcessGroup> old = std::move(group_);
  group_ = old->shrink({static_cast<int>(r)});
  replicas.retire(std::move(old));
  if (r < ctx_.optimizers.size()) {
    replicas.retire(std::shared_ptr<optim::Optimizer>(std::move(ctx_.optimizers[r])));
    ctx_.optimizers.erase(ctx_.optimizers.begin() + static_cast<std::ptrdiff_t>(r));
  }
  connect_replicas();
  build_reducer();
}

std::vector<Tensor> DdpStep::forward(const nn::ModuleInput& input) {
  DPE_CHECK(!GradMode::is_enabled(), "DataParallel (DDP mode): forward() with gradients enabled; in DDP every "
            "replica computes its own loss: train with forward_backward(input, target, loss) or train_step, and call "
            "forward under NoGradGuard for evaluation");
  return parallel_forward(ctx_, input, nullptr);
}

DdpStep::Shards DdpStep::shard(const Tensor& input, const Tensor& target) {
  const size_t n = ctx_.replicas->size();
  int64_t dim = 0;
  const int64_t batch = step_batch(input, target, ctx_.options.dim, &dim);
  const bool across_processes = group_->world_size() > group_->size();
  // Across processes another process may have the samples; in one, an empty batch has no loss.
  DPE_CHECK(batch > 0 || across_processes, "DataParallel::forward_backward: the batch is empty (0 samples along "
            "dim ", dim, "); expected at least one");
  // A device past the batch's chunks gets no sample (PyTorch's uneven-inputs problem, solved here): its
  // replica runs no forward or backward, contributes zeros with weight 0, and still takes part in every
  // collective, so the other replicas' gradients are the batch's mean and every replica steps alike.
  std::vector<int64_t> sizes = ctx_.split->chunk_sizes(batch);
  sizes.resize(n, 0);
  const size_t empty = static_cast<size_t>(std::count(sizes.begin(), sizes.end(), int64_t{0}));
  DPE_CHECK(empty == 0 || sync_batchnorm_layers_ == 0, "DataParallel (DDP mode): a batch of ", batch, " leaves ",
            empty, " of ", n, " devices without a sample, and the model's SyncBatchNorm layers need one on every "
            "replica; use a batch of at least ", n);
  ctx_.report.chunk_sizes = sizes;
  ctx_.report.used_devices.clear();
  for (size_t r = 0; r < n; ++r) {
    if (sizes[r] > 0) ctx_.report.used_devices.push_back(ctx_.replicas->devices()[r]);
  }
  Shards shards(dim, std::move(sizes), n);
  shards.input = input;
  shards.target = target;
  shards.batch = batch;
  shards.across_processes = across_processes;
  shards.sync = ctx_.sync;
  return shards;
}

double DdpStep::forward_backward(const Tensor& input, const Tensor& target, const LossFn& loss) {
  Shards shards = shard(input, target);
  refresh_trainable();
  if (shards.sync) reducer_->prepare_for_backward();
  const int64_t allreduces_before = group_->calls(Collective::AllReduce) + group_->calls(Collective::AllReduceInto);
  shards.start = Clock::now();
  try {
    ctx_.replicas->run([&](size_t r) { replica_task(r, shards, loss); }, group_.get());
  } catch (...) {
    reducer_->disarm();
    throw;
  }
  reducer_->disarm();
  return fold_report(shards, allreduces_before);
}

// Replica 0's buffers into replica r's, before a synchronised forward (PyTorch's broadcast_buffers).
void DdpStep::broadcast_buffers(size_t r, Shards& shards) {
  NoGradGuard no_grad;
  for (const Tensor& b : ctx_.replicas->buffers(r)) {
    group_->broadcast(static_cast<int>(r), b, 0);
    if (r != 0) shards.bytes[r].broadcast += static_cast<int64_t>(b.nbytes());
  }
}

// Replica r's part of the step, on its worker. checkpoint_if_lost: before each write into `shards`
// (core/lost_thread.h).
void DdpStep::replica_task(size_t r, Shards& shards, const LossFn& loss_fn) {
  const int rank = static_cast<int>(r);
  const Device& device = ctx_.replicas->devices()[r];
  const int64_t size = shards.rows.sizes[r];
  Shards::Times& time = shards.times[r];
  auto start = Clock::now();
  Tensor x = shards.rows.of(shards.input, r, device);
  Tensor y = shards.rows.of(shards.target, r, device);
  if (shards.input.device() != device) shards.bytes[r].scatter += static_cast<int64_t>(x.nbytes() + y.nbytes());
  time.scatter = ms_since(start);

  start = Clock::now();
  if (ctx_.options.broadcast_buffers && shards.sync) broadcast_buffers(r, shards);
  time.broadcast = ms_since(start);

  if (shards.sync) {
    // Each replica's gradient weighs its share of the global batch (n_r / N), so that uneven shards still
    // give the global batch's mean gradient (PyTorch averages the replicas' means instead); for even shards
    // the weight is exactly 1 / world size, PyTorch's.
    const double global_batch = shards.across_processes ? samples_over_processes(*group_, rank, size)
                                                        : static_cast<double>(shards.batch);
    reducer_->set_gradient_weight(r, static_cast<double>(size) / global_batch);
    reducer_->attach_gradients(r);
  }
  if (size == 0) {
    if (!shards.sync) return;
    reducer_->contribute_nothing(r);
    reducer_->finalize_backward(r);
    if (shards.across_processes) shards.global_loss[r] = loss_over_processes(*group_, rank, 0.0, 0);
    return;
  }
  start = Clock::now();
  Tensor out = ctx_.replicas->replica(r).forward(x);
  checkpoint_if_lost();
  time.forward = ms_since(start);
  start = Clock::now();
  Tensor loss = checked_loss(loss_fn, out, y);
  checkpoint_if_lost();
  time.loss = ms_since(start);

  start = Clock::now();
  const Tensor root = ctx_.backward_root(loss);  // loss x scale with a grad scaler
  if (shards.sync) reducer_->mark_unused_parameters(r, root);
  root.backward();
  if (shards.sync) reducer_->finalize_backward(r);
  checkpoint_if_lost();
  time.backward = ms_since(start);
  // Note [What the auto split measures]: until the replica began waiting in its last collective.
  const std::optional<Clock::time_point> arrived = shards.sync ? reducer_->entered_last_collective(r) : std::nullopt;
  time.arrived = std::chrono::duration<double, std::milli>(arrived.value_or(Clock::now()) - shards.start).count();
  const double value = loss.item();  // a CUDA device waits for the step here
  checkpoint_if_lost();
  shards.losses[r] = value;
  if (shards.across_processes && shards.sync) shards.global_loss[r] = loss_over_processes(*group_, rank, value, size);
}

// The step's report from what every replica measured (a phase's time is the slowest replica's), and its loss.
double DdpStep::fold_report(const Shards& shards, int64_t allreduces_before) {
  StepReport& report = ctx_.report;
  const size_t n = shards.times.size();
  auto slowest = [&](double Shards::Times::*phase) {
    double most = 0;
    for (const Shards::Times& t : shards.times) most = std::max(most, t.*phase);
    return most;
  };
  report.scatter_ms = slowest(&Shards::Times::scatter);
  report.broadcast_ms = slowest(&Shards::Times::broadcast);
  report.forward_ms = slowest(&Shards::Times::forward);
  report.loss_ms = slowest(&Shards::Times::loss);
  report.backward_ms = slowest(&Shards::Times::backward);
  report.device_compute_ms.clear();
  for (size_t r = 0; r < n; ++r) {
    report.scatter.bytes += shards.bytes[r].scatter;
    report.broadcast.bytes += shards.bytes[r].broadcast;
    report.device_compute_ms.push_back(shards.times[r].arrived);
  }
  report.buckets = static_cast<int64_t>(reducer_->num_buckets());
  if (shards.sync) {
    for (size_t r = 0; r < n; ++r) report.reduce_ms = std::max(report.reduce_ms, reducer_->allreduce_ms(r));
    report.reduce.bytes = reducer_->allreduce_bytes() * static_cast<int64_t>(n);
    report.buckets_reduced_during_backward = reducer_->launched_during_backward() / static_cast<int64_t>(n);
  }
  report.reduce.transfers =
      group_->calls(Collective::AllReduce) + group_->calls(Collective::AllReduceInto) - allreduces_before;
  if (shards.across_processes && shards.sync) return shards.global_loss[0];
  double total = 0;
  for (size_t r = 0; r < n; ++r) total += shards.losses[r] * static_cast<double>(shards.rows.sizes[r]);
  return total / static_cast<double>(shards.batch);
}

bool DdpStep::step_optimizers(optim::GradScaler* scaler) {
  std::vector<std::unique_ptr<optim::Optimizer>>& optimizers = ctx_.optimizers;
  DPE_INTERNAL_ASSERT(optimizers.size() == ctx_.replicas->size(), "DDP: ", optimizers.size(), " optimizers for ",
                      ctx_.replicas->size(), " replicas");
  if (scaler == nullptr) {
    ctx_.replicas->run([&](size_t r) { optimizers[r]->step(); }, group_.get());
    return true;
  }
  std::vector<char> stepped(optimizers.size(), 0);
  ctx_.replicas->run([&](size_t r) {
    const bool took_step = step_through_scaler(*scaler, *optimizers[r], [&](bool found_inf) {
      return any_over_processes(*group_, static_cast<int>(r), found_inf);
    });
    checkpoint_if_lost();  // before writing into this frame (core/lost_thread.h)
    stepped[r] = took_step;
  }, group_.get());
  for (size_t r = 1; r < stepped.size(); ++r) {
    DPE_INTERNAL_ASSERT(stepped[r] == stepped[0], "DDP: replica ", r, " and replica 0 took different skip decisions");
  }
  return stepped[0] != 0;
}

}  // namespace dpe
