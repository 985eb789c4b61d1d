#include "engine/dp_step.h"

#include "core/autograd/backward.h"
#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"
#include "core/error.h"
#include "core/lost_thread.h"
#include "core/ops.h"
#include "engine/across_processes.h"
#include "engine/dp_reducer.h"
#include "engine/loss_scaling.h"
#include "engine/replica_error.h"
#include "engine/timing.h"
#include "scatter_gather/scatter_gather.h"

namespace dpe {

using detail::Clock;
using detail::ms_since;

namespace {

// Where the tensor arguments of a ModuleInput are: positional indices, then names.
struct TensorSlots {
  std::vector<size_t> positional;
  std::vector<std::string> named;
  std::vector<Tensor> tensors;      // in that order
  std::vector<std::string> labels;  // "argument 0", "argument 'mask'"
};

TensorSlots tensor_slots(const nn::ModuleInput& input) {
  TensorSlots slots;
  for (size_t i = 0; i < input.args.size(); ++i) {
    if (const Tensor* t = std::get_if<Tensor>(&input.args[i])) {
      slots.positional.push_back(i);
      slots.tensors.push_back(*t);
      slots.labels.push_back("argument " + std::to_string(i));
    }
  }
  for (const auto& [name, arg] : input.kwargs) {
    if (const Tensor* t = std::get_if<Tensor>(&arg)) {
      slots.named.push_back(name);
      slots.tensors.push_back(*t);
      slots.labels.push_back("argument '" + name + "'");
    }
  }
  return slots;
}

// A copy of `input` whose tensor arguments are replaced by `tensors` (same order as tensor_slots).
nn::ModuleInput with_tensors(const nn::ModuleInput& input, const TensorSlots& slots, const std::vector<Tensor>& tensors) {
  nn::ModuleInput out = input;
  size_t k = 0;
  for (size_t i : slots.positional) out.args[i] = tensors[k++];
  for (const std::string& name : slots.named) out.kwargs[name] = tensors[k++];
  return out;
}

// Every tensor argument is split along dim, so all must have it and agree on its size there. Returns the
// batch (-1 without a tensor argument) and sets *dim to the first argument's normalised dim.
int64_t check_batch(const TensorSlots& slots, int64_t dim_option, int64_t* dim) {
  const std::vector<Tensor>& tensors = slots.tensors;
  const std::vector<std::string>& labels = slots.labels;
  int64_t batch = -1;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const Tensor& x = tensors[t];
    DPE_CHECK(x.defined(), "DataParallel: ", labels[t], " is an undefined tensor");
    DPE_CHECK(x.dim() > 0, "DataParallel: ", labels[t], " is a 0-dim tensor and cannot be split along dim ",
              dim_option);
    int64_t d = normalize_dim(dim_option, x.dim(), "DataParallel");
    if (t == 0) *dim = d;
    DPE_CHECK(batch < 0 || x.size(d) == batch, "DataParallel: tensor arguments differ in size along dim ", d, ": ",
              labels[0], " has ", batch, ", ", labels[t], " has ", x.size(d));
    batch = x.size(d);
  }
  return batch;
}

// One device, or nothing to split: the master runs alone (no broadcast, no reduction), bit for bit the
// module's own forward.
std::vector<Tensor> forward_on_master(StepContext& ctx, const nn::ModuleInput& input, const TensorSlots& slots,
                                      int64_t batch) {
  ReplicaSet& replicas = *ctx.replicas;
  const Device& master = replicas.devices()[0];
  ctx.report.chunk_sizes = {std::max<int64_t>(batch, 0)};
  ctx.report.used_devices = {master};
  auto start = Clock::now();
  std::vector<Tensor> moved;
  // non_blocking, as the scatter's copies: from a pinned batch the copy to a CUDA device is only enqueued.
  for (const Tensor& x : slots.tensors) moved.push_back(x.to(master, /*non_blocking=*/true));
  std::vector<Tensor> outputs;
  if (replicas.size() == 1) {
    outputs = replicas.replica(0).forward_args(with_tensors(input, slots, moved));
  } else {
    replicas.run(1, [&](size_t) { outputs = replicas.replica(0).forward_args(input); });
  }
  for (Tensor& o : outputs) o = o.to(ctx.output_device);
  ctx.report.forward_ms = ms_since(start);
  record_memory(ctx);
  return outputs;
}

// The scattered tensor arguments of one step. Chunk k belongs to replica ran[k]: the devices whose share of
// the batch is not empty (device 0 alone for an empty batch), in device order.
struct ScatteredInputs {
  std::vector<size_t> ran;
  std::vector<int64_t> sizes;                     // [k]: the chunk's samples
  std::vector<std::vector<Tensor>> chunks;        // [t][k]: chunk k of tensor argument t, on its device
  std::vector<std::vector<Tensor>> chunk_leaves;  // the chunks of the arguments whose gradient flows back
  std::vector<Tensor> grad_inputs;                // those arguments, and their devices
  std::vector<Device> grad_input_devices;
};

// Splits every tensor argument by the split and copies chunk k to its device. Chunks of arguments that
// require grad become leaves, whose gradients the gather node gathers back.
ScatteredInputs scatter_inputs(StepContext& ctx, const std::vector<Tensor>& tensors, int64_t dim, int64_t batch) {
  auto start = Clock::now();
  StepReport& report = ctx.report;
  report.chunk_sizes = ctx.split->chunk_sizes(batch);
  ScatteredInputs scattered;
  for (size_t i = 0; i < report.chunk_sizes.size(); ++i) {
    if (report.chunk_sizes[i] == 0) continue;
    scattered.ran.push_back(i);
    scattered.sizes.push_back(report.chunk_sizes[i]);
  }
  if (scattered.ran.empty()) scattered = {.ran = {0}, .sizes = {0}};
  report.used_devices.clear();
  for (size_t i : scattered.ran) report.used_devices.push_back(ctx.replicas->devices()[i]);
  const bool record = GradMode::is_enabled();
  scattered.chunks.resize(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const Tensor& x = tensors[t];
    {
      NoGradGuard no_grad;
      scattered.chunks[t] = scatter(x.detach(), report.used_devices, dim, scattered.sizes);
    }
    for (const Tensor& c : scattered.chunks[t]) {
      if (c.device() != x.device()) report.scatter.bytes += static_cast<int64_t>(c.nbytes());
    }
    if (record && x.requires_grad()) {
      for (Tensor& c : scattered.chunks[t]) c = c.detach().set_requires_grad(true);
      scattered.chunk_leaves.push_back(scattered.chunks[t]);
      scattered.grad_inputs.push_back(x);
      scattered.grad_input_devices.push_back(x.device());
    }
  }
  report.scatter_ms = ms_since(start);
  return scattered;
}

// BufferPolicy::Average: the master's floating-point buffers become the mean of the replicas that ran.
void average_buffers(StepContext& ctx, const std::vector<size_t>& ran) {
  NoGradGuard no_grad;
  std::vector<std::vector<Tensor>> per_replica(ran.size());
  std::vector<Tensor> master;
  for (const Tensor& b : ctx.replicas->buffers(0)) {
    if (is_floating_point(b.dtype())) master.push_back(b);
  }
  if (master.empty()) return;
  for (size_t k = 0; k < ran.size(); ++k) {
    for (const Tensor& b : ctx.replicas->buffers(ran[k])) {
      if (is_floating_point(b.dtype())) per_replica[k].push_back(b);
    }
  }
  // The sum lands in fresh tensors first: the master's buffers may themselves be inputs.
  std::vector<Tensor> sums = reduce_add_coalesced(per_replica, ctx.replicas->devices()[0], ctx.options.bucket_bytes);
  for (size_t i = 0; i < master.size(); ++i) master[i].copy_(sums[i] * (1.0 / static_cast<double>(ran.size())));
}

// Forward on every device with a chunk at once, each replica on its own worker. outputs[k]: replica ran[k]'s.
std::vector<std::vector<Tensor>> parallel_apply(StepContext& ctx, const nn::ModuleInput& input,
                                                const TensorSlots& slots, const ScatteredInputs& scattered) {
  auto start = Clock::now();
  ReplicaSet& replicas = *ctx.replicas;
  std::vector<std::vector<Tensor>> outputs(scattered.ran.size());
  std::vector<int> slot(scattered.ran.back() + 1, -1);
  for (size_t k = 0; k < scattered.ran.size(); ++k) slot[scattered.ran[k]] = static_cast<int>(k);
  ctx.report.device_compute_ms.assign(replicas.size(), 0.0);
  replicas.run(slot.size(), [&](size_t i) {
    if (slot[i] < 0) return;
    std::vector<Tensor> mine;
    for (const auto& per_tensor : scattered.chunks) mine.push_back(per_tensor[slot[i]]);
    std::vector<Tensor> out = replicas.replica(i).forward_args(with_tensors(input, slots, mine));
    checkpoint_if_lost();  // before writing into this frame (core/lost_thread.h)
    outputs[slot[i]] = std::move(out);
    ctx.report.device_compute_ms[i] = ms_since(start);  // Note [What the auto split measures]: from the phase's start
  });
  for (size_t k = 1; k < outputs.size(); ++k) {
    DPE_CHECK(outputs[k].size() == outputs[0].size(), "DataParallel: replica ", scattered.ran[k], " returned ",
              outputs[k].size(), " outputs, replica ", scattered.ran[0], " returned ", outputs[0].size());
  }
  if (ctx.options.buffers == BufferPolicy::Average) average_buffers(ctx, scattered.ran);
  ctx.report.forward_ms = ms_since(start);
  return outputs;
}

}  // namespace

// The grad_fn of a DP step's gathered outputs (output j of the step is this node's output j): backward
// lands here with the gradients of the gathered outputs, and this node runs the replicas' backward passes in
// parallel, then completes the reduction into the master (Note [DP reduction overlap]). Its edges lead to the
// step's tensor arguments that require grad. Contract: the DataParallel, and its mode, outlive the backward
// of its outputs.
class DataParallelGatherNode final : public autograd::Node {
 public:
  // outputs[k][j]: output j of replica ran[k]. chunk_inputs[t][k]: its chunk of tensor argument t (leaves;
  // only for arguments that require grad). scalar_outputs[j]: output j was 0-dim on every replica.
  DataParallelGatherNode(DpStep* step, std::vector<std::vector<Tensor>> outputs, const ScatteredInputs& scattered,
                         int64_t dim, std::vector<bool> scalar_outputs)
      : step_(step),
        outputs_(std::move(outputs)),
        chunk_inputs_(scattered.chunk_leaves),
        input_devices_(scattered.grad_input_devices),
        sizes_(scattered.sizes),
        ran_(scattered.ran),
        dim_(dim),
        scalar_outputs_(std::move(scalar_outputs)) {
    num_outputs = static_cast<int>(scalar_outputs_.size());
  }

  std::string name() const override { return "DataParallelGatherBackward"; }
  bool runs_nested_backward() const override { return true; }
  void release_saved() override {
    outputs_.clear();
    chunk_inputs_.clear();
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    DPE_CHECK(!outputs_.empty(), "backward through a DataParallel step a second time: its graph was freed");
    const size_t ran = outputs_.size();
    // roots[k] / root_grads[k]: replica ran_[k]'s outputs that take part, with their slice of the gradient.
    std::vector<std::vector<Tensor>> roots(ran), root_grads(ran);
    for (size_t j = 0; j < grads.size(); ++j) {
      if (!grads[j].defined()) continue;
      std::vector<Tensor> pieces = scalar_outputs_[j] ? grads[j].split(std::vector<int64_t>(ran, 1), 0)
                                                      : grads[j].split(sizes_, dim_);
      for (size_t k = 0; k < ran; ++k) {
        const Tensor& out = outputs_[k][j];
        if (!out.requires_grad()) continue;
        roots[k].push_back(out);
        // Note [The gathered gradient goes before the replicas' backward]: a slice on the output device is
        // copied, so that it does not keep the whole gradient alive.
        Tensor piece = pieces[k].reshape(out.shape());
        root_grads[k].push_back(ran > 1 && piece.device() == out.device() ? piece.clone() : piece.to(out.device()));
      }
    }
    // Note [The gathered gradient goes before the replicas' backward]
    // The gradient of the gathered output is (B, ...) on output_device: for a language model's logits, B x T x
    // vocab floats, the largest tensor of the step. Every replica has its slice now, so it is freed here rather
    // than after every replica's backward, which is when DP's first device peaks (it also runs replica 0's).
    // The price is a copy of replica 0's slice (1/n of it, alive with the whole for a moment): less memory
    // whenever replica 0's backward needs more than that slice, as any model's does whose gradients outweigh
    // its outputs. The Llama small preset on 4 devices: DP's first device 5118 -> 4594 MB (docs/BENCHMARKS.md).
    grads.clear();
    step_->backward(roots, root_grads, ran_);
    std::vector<Tensor> input_grads;
    for (size_t t = 0; t < chunk_inputs_.size(); ++t) {
      std::vector<Tensor> chunk_grads;
      for (const Tensor& c : chunk_inputs_[t]) {
        chunk_grads.push_back(c.grad().defined() ? c.grad()
                                                 : zeros(c.shape(), TensorOptions(c.dtype()).with_device(c.device())));
      }
      input_grads.push_back(gather(chunk_grads, input_devices_[t], dim_));
    }
    return input_grads;
  }

 private:
  DpStep* step_;
  std::vector<std::vector<Tensor>> outputs_;
  std::vector<std::vector<Tensor>> chunk_inputs_;
  std::vector<Device> input_devices_;
  std::vector<int64_t> sizes_;
  std::vector<size_t> ran_;
  int64_t dim_;
  std::vector<bool> scalar_outputs_;
};

namespace {

// Gathers output j of every replica that ran on the output device (0-dim outputs: one value per replica). In
// DP mode a recorded graph gets one DataParallelGatherNode as the gathered outputs' grad_fn.
std::vector<Tensor> gather_outputs(StepContext& ctx, std::vector<std::vector<Tensor>> outputs,
                                   const ScatteredInputs& scattered, int64_t dim, DpStep* dp) {
  auto start = Clock::now();
  const size_t num_outputs = outputs[0].size();
  std::vector<Tensor> gathered(num_outputs);
  std::vector<bool> scalar(num_outputs);
  bool any_graph = false;
  for (size_t j = 0; j < num_outputs; ++j) {
    std::vector<Tensor> parts;
    for (const std::vector<Tensor>& replica_outputs : outputs) {
      const Tensor& out = replica_outputs[j];
      parts.push_back(out.detach());
      any_graph = any_graph || out.requires_grad();
      if (out.device() != ctx.output_device) ctx.report.gather.bytes += static_cast<int64_t>(out.nbytes());
    }
    scalar[j] = parts[0].dim() == 0;
    NoGradGuard no_grad;
    gathered[j] = gather(parts, ctx.output_device, scalar[j] ? 0 : dim);
  }
  if (dp != nullptr && GradMode::is_enabled() && any_graph) {
    auto node = std::make_shared<DataParallelGatherNode>(dp, std::move(outputs), scattered, dim, scalar);
    for (const Tensor& x : scattered.grad_inputs) node->next_edges.push_back(autograd::gradient_edge(x));
    for (size_t j = 0; j < num_outputs; ++j) {
      auto& meta = autograd::meta_of(gathered[j]);
      meta.grad_fn = node;
      meta.output_nr = static_cast<int>(j);
    }
  }
  ctx.report.gather_ms = ms_since(start);
  record_memory(ctx);
  return gathered;
}

}  // namespace

std::vector<Tensor> parallel_forward(StepContext& ctx, const nn::ModuleInput& input, DpStep* dp) {
  const TensorSlots slots = tensor_slots(input);
  int64_t dim = ctx.options.dim;
  const int64_t batch = check_batch(slots, ctx.options.dim, &dim);
  if (ctx.replicas->size() == 1 || slots.tensors.empty()) return forward_on_master(ctx, input, slots, batch);
  ScatteredInputs scattered = scatter_inputs(ctx, slots.tensors, dim, batch);
  auto start = Clock::now();
  if (dp != nullptr) {
    std::vector<size_t> to(scattered.ran.begin() + (scattered.ran[0] == 0 ? 1 : 0), scattered.ran.end());
    ctx.report.broadcast = dp->replicate(to);
  }
  ctx.report.broadcast_ms = ms_since(start);
  std::vector<std::vector<Tensor>> outputs = parallel_apply(ctx, input, slots, scattered);
  return gather_outputs(ctx, std::move(outputs), scattered, dim, dp);
}

DpStep::DpStep(StepContext& ctx) : Step(ctx) {
  if (spans_processes(ctx_.options.backend)) masters_ = std::make_unique<MastersSync>(*ctx_.replicas, ctx_.options);
  build_reducer();
}

DpStep::~DpStep() {
  // A worker lost in an earlier step may still be inside the reducer's hooks (Note [Lost workers]).
  ctx_.replicas->retire(std::shared_ptr<DpReducer>(std::move(reducer_)));
}

void DpStep::build_reducer() {
  ctx_.replicas->retire(std::shared_ptr<DpReducer>(std::move(reducer_)));
  if (ctx_.replicas->size() == 1) return;
  reducer_ = std::make_unique<DpReducer>(ctx_.replicas->trainable_params(), ctx_.replicas->devices(),
                                         ctx_.options.bucket_bytes, ctx_.options.timeout);
}

void DpStep::trainable_changed() {
  // The replicas' gradients are the engine's scratch, one step long: none is left on a frozen parameter.
  ReplicaSet& replicas = *ctx_.replicas;
  for (size_t r = 1; r < replicas.size(); ++r) {
    for (size_t k = 0; k < replicas.trainable().size(); ++k) {
      if (!replicas.trainable()[k]) replicas.params(r)[k].set_grad({});
    }
  }
  build_reducer();
}

TransferStats DpStep::replicate(const std::vector<size_t>& to) {
  return ctx_.replicas->replicate(to, ctx_.options.bucket_bytes);
}

void DpStep::replica_dropped(size_t) { build_reducer(); }

std::vector<int> DpStep::missing_at_last_timeout() const {
  return reducer_ ? reducer_->missing_at_last_timeout() : std::vector<int>{};
}

ProcessGroup* DpStep::process_group() { return masters_ ? &masters_->group() : nullptr; }

void DpStep::optimizers_made() {
  if (!masters_ || ctx_.optimizers.empty()) return;
  verify_optimizer_across_processes(masters_->group(), *ctx_.optimizers[0], "DP",
                                    [](const std::function<void(size_t)>& fn) { fn(0); });
}

size_t DpStep::num_buckets() const { return reducer_ ? reducer_->num_buckets() : 0; }

std::vector<Tensor> DpStep::forward(const nn::ModuleInput& input) {
  if (GradMode::is_enabled()) refresh_trainable();
  return parallel_forward(ctx_, input, this);
}

double DpStep::forward_backward(const Tensor& input, const Tensor& target, const LossFn& loss_fn) {
  StepReport& report = ctx_.report;
  const bool across_processes = masters_ != nullptr && ctx_.sync;
  try {
    ctx_.replicas->check_master_placement();
    if (across_processes) masters_->broadcast_buffers();
    Tensor loss;
    auto start = Clock::now();
    {
      // The gathered output lives as long as the loss's graph needs it, not through the backward: the step
      // API's caller never sees it (Note [The gathered gradient goes before the replicas' backward]).
      std::vector<Tensor> outputs = forward(nn::ModuleInput(input));
      DPE_CHECK(outputs.size() == 1, "DataParallel::forward: the module returned ", outputs.size(),
                " outputs; use forward_args for several");
      start = Clock::now();
      loss = checked_loss(loss_fn, outputs[0], target.to(ctx_.output_device, /*non_blocking=*/true));
    }
    report.loss_ms = ms_since(start);
    start = Clock::now();
    ctx_.backward_root(loss).backward();  // through DataParallelGatherNode when several devices ran
    report.backward_ms = ms_since(start);
    const double value = loss.item();
    return across_processes ? masters_->average(value, input.size(ctx_.options.dim), report) : value;
  } catch (const std::exception& e) {
    // The other processes' masters are waiting for this one: tell them why (DDP's groups do it per replica).
    if (masters_) masters_->group().abort(detail::str_cat_or_empty("the DP step failed: ", e.what()));
    throw;
  }
}

void DpStep::backward(const std::vector<std::vector<Tensor>>& roots,
                      const std::vector<std::vector<Tensor>>& root_grads, const std::vector<size_t>& ran) {
  StepReport& report = ctx_.report;
  const size_t used = ran.back() + 1;
  std::vector<int> slot(used, -1);
  for (size_t k = 0; k < ran.size(); ++k) slot[ran[k]] = static_cast<int>(k);
  auto start = Clock::now();
  if (reducer_) reducer_->prepare(used);
  try {
    std::vector<double>& compute_ms = report.device_compute_ms;
    compute_ms.resize(ctx_.replicas->size(), 0.0);
    auto abort_shares = [&](size_t i, const std::exception_ptr& error) {
      if (reducer_) reducer_->abort_shares(replica_failure_reason(i, ctx_.replicas->devices()[i], error));
    };
    ctx_.replicas->run(used, [&](size_t i) {
      if (slot[i] >= 0 && !roots[slot[i]].empty()) autograd::backward(roots[slot[i]], root_grads[slot[i]]);
      checkpoint_if_lost();  // before writing into this frame (core/lost_thread.h)
      if (slot[i] >= 0) compute_ms[i] += ms_since(start);  // Note [What the auto split measures]
      if (reducer_) reducer_->reduce_share(i);  // Note [DP reduction in shares]; after the timing
    }, abort_shares);
  } catch (...) {
    // This step's master gradient is incomplete anyway. Nothing is reduced here: a worker declared lost
    // may still be writing it (Note [Lost workers] in engine/worker_pool.cc).
    if (reducer_) reducer_->disarm();
    throw;
  }
  report.backward_ms = ms_since(start);
  if (reducer_) {
    auto reduce_start = Clock::now();
    report.reduce = reducer_->finish();
    report.reduce_ms = ms_since(reduce_start);  // what was left after backward; the rest overlapped
    report.buckets = static_cast<int64_t>(reducer_->num_buckets());
    report.buckets_reduced_during_backward = reducer_->buckets_reduced_early();
  }
  record_memory(ctx_);
}

bool DpStep::step_optimizers(optim::GradScaler* scaler) {
  optim::Optimizer& optimizer = *ctx_.optimizers[0];
  if (scaler == nullptr) {
    optimizer.step();
    return true;
  }
  return step_through_scaler(*scaler, optimizer, [&](bool found_inf) {
    return masters_ ? masters_->any(found_inf) : found_inf;
  });
}

}  // namespace dpe
