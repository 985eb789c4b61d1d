// DataParallel's DP step, as PyTorch's DataParallel.forward reads: scatter the inputs, replicate (bring
// the replicas up to date), parallel_apply, gather the outputs. The backward step lives in the gather node's
// apply() (DataParallelGatherNode below): the replicas' backward passes in parallel and the reduction into
// the master.
#include "core/autograd/backward.h"
#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"
#include "core/error.h"
#include "core/lost_thread.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "engine/ddp_reducer.h"
#include "engine/gradient_reducer.h"
#include "engine/replica_error.h"
#include "engine/worker_pool.h"
#include "engine/timing.h"
#include "scatter_gather/scatter_gather.h"

namespace dpe {

using detail::Clock;
using detail::ms_since;

// The grad_fn of a DP step's gathered outputs (output j of the step is this node's output j): backward
// lands here with the gradients of the gathered outputs, and this node runs the replicas' backward passes in
// parallel, then completes the reduction into the master (Note [DP reduction overlap]). Its edges lead to the
// step's tensor arguments that require grad. Contract: the DataParallel outlives the backward of its outputs.
class DataParallelGatherNode final : public autograd::Node {
 public:
  // outputs[i][j]: output j of replica i. chunk_inputs[t][i]: replica i's chunk of tensor argument t (leaves;
  // only for arguments that require grad). scalar_outputs[j]: output j was 0-dim on every replica.
  DataParallelGatherNode(DataParallel* dp, std::vector<std::vector<Tensor>> outputs,
                         std::vector<std::vector<Tensor>> chunk_inputs, std::vector<Device> input_devices,
                         std::vector<int64_t> sizes, int64_t dim, std::vector<bool> scalar_outputs)
      : dp_(dp),
        outputs_(std::move(outputs)),
        chunk_inputs_(std::move(chunk_inputs)),
        input_devices_(std::move(input_devices)),
        sizes_(std::move(sizes)),
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
    size_t used = outputs_.size();
    // roots[i] / root_grads[i]: replica i's outputs that take part, with their slice of the gradient.
    std::vector<std::vector<Tensor>> roots(used), root_grads(used);
    for (size_t j = 0; j < grads.size(); ++j) {
      if (!grads[j].defined()) continue;
      std::vector<Tensor> pieces = scalar_outputs_[j] ? grads[j].split(std::vector<int64_t>(used, 1), 0)
                                                      : grads[j].split(sizes_, dim_);
      for (size_t i = 0; i < used; ++i) {
        const Tensor& out = outputs_[i][j];
        if (!out.requires_grad()) continue;
        roots[i].push_back(out);
        root_grads[i].push_back(pieces[i].reshape(out.shape()).to(out.device()));
      }
    }

    auto start = Clock::now();
    if (dp_->reducer_) dp_->reducer_->prepare(used);
    try {
      std::vector<double>& compute_ms = dp_->report_.device_compute_ms;
      compute_ms.resize(dp_->device_ids_.size(), 0.0);
      auto abort_shares = [&](size_t i, const std::exception_ptr& error) {
        if (dp_->reducer_) dp_->reducer_->abort_shares(replica_failure_reason(i, dp_->device_ids_[i], error));
      };
      dp_->pool_->run(used, [&](size_t i) {
        if (!roots[i].empty()) autograd::backward(roots[i], root_grads[i]);
        checkpoint_if_lost();  // before writing into this frame (core/lost_thread.h)
        compute_ms[i] += ms_since(start);  // Note [What the auto split measures]: from the phase's start
        if (dp_->reducer_) dp_->reducer_->reduce_share(i);  // Note [DP reduction in shares]; after the timing
      }, abort_shares);
    } catch (...) {
      // This step's master gradient is incomplete anyway. Nothing is reduced here: a worker declared lost
      // may still be writing it (Note [Lost workers] in engine/worker_pool.cc).
      if (dp_->reducer_) dp_->reducer_->disarm();
      throw;
    }
    dp_->report_.backward_ms = ms_since(start);
    if (dp_->reducer_) {
      auto reduce_start = Clock::now();
      dp_->report_.reduce = dp_->reducer_->finish();
      dp_->report_.reduce_ms = ms_since(reduce_start);  // what was left after backward; the rest overlapped
      dp_->report_.buckets = static_cast<int64_t>(dp_->reducer_->num_buckets());
      dp_->report_.buckets_reduced_during_backward = dp_->reducer_->buckets_reduced_early();
    }
    dp_->refresh_memory_report();

    std::vector<Tensor> input_grads;
    for (size_t t = 0; t < chunk_inputs_.size(); ++t) {
      std::vector<Tensor> chunk_grads;
      for (const Tensor& c : chunk_inputs_[t]) {
        chunk_grads.push_back(c.grad().defined() ? c.grad() : zeros(c.shape(), TensorOptions(c.dtype()).with_device(c.device())));
      }
      input_grads.push_back(gather(chunk_grads, input_devices_[t], dim_));
    }
    return input_grads;
  }

 private:
  DataParallel* dp_;
  std::vector<std::vector<Tensor>> outputs_;
  std::vector<std::vector<Tensor>> chunk_inputs_;
  std::vector<Device> input_devices_;
  std::vector<int64_t> sizes_;
  int64_t dim_;
  std::vector<bool> scalar_outputs_;
};

// Where the tensor arguments of a ModuleInput are: positional indices, then names.
struct detail::TensorSlots {
  std::vector<size_t> positional;
  std::vector<std::string> named;
  std::vector<Tensor> tensors;     // in that order
  std::vector<std::string> labels;  // "argument 0", "argument 'mask'"
};

namespace {

using detail::TensorSlots;

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

}  // namespace

// The scattered tensor arguments of one DP step.
struct DataParallel::ScatteredInputs {
  std::vector<std::vector<Tensor>> chunks;        // [t][i]: chunk i of tensor argument t, on device_ids[i]
  std::vector<std::vector<Tensor>> chunk_leaves;  // the chunks of the arguments whose gradient flows back
  std::vector<Tensor> grad_inputs;                // those arguments, and their devices
  std::vector<Device> grad_input_devices;
};

void DataParallel::sync_replicas(size_t used) {
  if (used <= 1) return;
  std::vector<std::vector<Tensor>> destinations(replica_state_.begin() + 1, replica_state_.begin() + static_cast<int64_t>(used));
  report_.broadcast = broadcast_coalesced_into(replica_state_[0], destinations, options_.bucket_bytes);
}

void DataParallel::average_buffers(size_t used) {
  NoGradGuard no_grad;
  std::vector<std::vector<Tensor>> per_replica(used);
  std::vector<Tensor> master;
  for (size_t r = 0; r < used; ++r) {
    for (const Tensor& b : replica_buffers_[r]) {
      if (!is_floating_point(b.dtype())) continue;
      per_replica[r].push_back(b);
      if (r == 0) master.push_back(b);
    }
  }
  if (master.empty()) return;
  // The sum lands in fresh tensors first: the master's buffers are themselves inputs.
  std::vector<Tensor> sums = reduce_add_coalesced(per_replica, device_ids_[0], options_.bucket_bytes);
  for (size_t i = 0; i < master.size(); ++i) {
    Tensor dst = master[i];
    dst.copy_(sums[i] * (1.0 / static_cast<double>(used)));
  }
}

Tensor DataParallel::forward(const Tensor& input) {
  DPE_CHECK(input.defined(), "DataParallel::forward: undefined input");
  std::vector<Tensor> outputs = forward_args(nn::ModuleInput(input));
  DPE_CHECK(outputs.size() == 1, "DataParallel::forward: the module returned ", outputs.size(),
            " outputs; use forward_args for several");
  return outputs[0];
}

std::vector<Tensor> DataParallel::forward_args(const nn::ModuleInput& input) {
  check_master_placement();
  DPE_CHECK(options_.mode == ParallelMode::DP || !GradMode::is_enabled(),
            "DataParallel (DDP mode): forward() with gradients enabled; in DDP every replica computes its own "
            "loss: train with forward_backward(input, target, loss) or train_step, and call forward under "
            "NoGradGuard for evaluation");
  report_ = StepReport{.mode = options_.mode};
  const TensorSlots slots = tensor_slots(input);
  int64_t dim = options_.dim;
  const int64_t batch = check_batch(slots, &dim);
  if (device_ids_.size() == 1 || slots.tensors.empty()) return forward_on_master(input, slots, batch);
  if (GradMode::is_enabled()) refresh_trainable();

  ScatteredInputs scattered = scatter_inputs(slots.tensors, dim, batch);
  const size_t used = report_.chunk_sizes.size();
  auto start = Clock::now();
  if (options_.mode == ParallelMode::DP) sync_replicas(used);  // replicate; DDP replicas are kept in step by their optimizers
  report_.broadcast_ms = ms_since(start);
  std::vector<std::vector<Tensor>> outputs = parallel_apply(input, slots, scattered, used);
  return gather_outputs(std::move(outputs), scattered, dim);
}

// Every tensor argument is split along dim, so all must have it and agree on its size there. Returns the
// batch (-1 without a tensor argument) and sets *dim to the first argument's normalised dim.
int64_t DataParallel::check_batch(const TensorSlots& slots, int64_t* dim) const {
  const std::vector<Tensor>& tensors = slots.tensors;
  const std::vector<std::string>& labels = slots.labels;
  int64_t batch = -1;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const Tensor& x = tensors[t];
    DPE_CHECK(x.defined(), "DataParallel: ", labels[t], " is an undefined tensor");
    DPE_CHECK(x.dim() > 0, "DataParallel: ", labels[t], " is a 0-dim tensor and cannot be split along dim ",
              options_.dim);
    int64_t d = normalize_dim(options_.dim, x.dim(), "DataParallel");
    if (t == 0) *dim = d;
    DPE_CHECK(batch < 0 || x.size(d) == batch, "DataParallel: tensor arguments differ in size along dim ", d, ": ",
              labels[0], " has ", batch, ", ", labels[t], " has ", x.size(d));
    batch = x.size(d);
  }
  return batch;
}

// One device, or nothing to split: the master runs alone (no broadcast, no reduction), bit for bit the
// module's own forward.
std::vector<Tensor> DataParallel::forward_on_master(const nn::ModuleInput& input, const TensorSlots& slots,
                                                    int64_t batch) {
  report_.chunk_sizes = {std::max<int64_t>(batch, 0)};
  report_.used_devices = {device_ids_[0]};
  auto start = Clock::now();
  std::vector<Tensor> moved;
  // non_blocking, as the scatter's copies: from a pinned batch the copy to a CUDA device is only enqueued.
  for (const Tensor& x : slots.tensors) moved.push_back(x.to(device_ids_[0], /*non_blocking=*/true));
  std::vector<Tensor> outputs;
  if (device_ids_.size() == 1) {
    outputs = replicas_[0]->forward_args(with_tensors(input, slots, moved));
  } else {
    pool_->run(1, [&](size_t) { outputs = replicas_[0]->forward_args(input); });
  }
  for (Tensor& o : outputs) o = o.to(output_device_);
  report_.forward_ms = ms_since(start);
  refresh_memory_report();
  return outputs;
}

// Splits every tensor argument by the split rule and copies chunk i to device_ids[i] (used devices = the
// non-empty chunks). Chunks of arguments that require grad become leaves, whose gradients the gather node
// gathers back.
DataParallel::ScatteredInputs DataParallel::scatter_inputs(const std::vector<Tensor>& tensors, int64_t dim,
                                                           int64_t batch) {
  auto start = Clock::now();
  report_.chunk_sizes = chunk_sizes(batch);
  const size_t used = report_.chunk_sizes.size();
  report_.used_devices.assign(device_ids_.begin(), device_ids_.begin() + static_cast<int64_t>(used));
  const bool record = GradMode::is_enabled();
  ScatteredInputs scattered;
  scattered.chunks.resize(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const Tensor& x = tensors[t];
    {
      NoGradGuard no_grad;
      scattered.chunks[t] = scatter(x.detach(), report_.used_devices, dim, report_.chunk_sizes);
    }
    for (const Tensor& c : scattered.chunks[t]) {
      if (c.device() != x.device()) report_.scatter.bytes += static_cast<int64_t>(c.nbytes());
    }
    if (record && x.requires_grad()) {
      for (Tensor& c : scattered.chunks[t]) c = c.detach().set_requires_grad(true);
      scattered.chunk_leaves.push_back(scattered.chunks[t]);
      scattered.grad_inputs.push_back(x);
      scattered.grad_input_devices.push_back(x.device());
    }
  }
  report_.scatter_ms = ms_since(start);
  return scattered;
}

// Forward on every used device at once, each replica on its own worker with its chunks.
std::vector<std::vector<Tensor>> DataParallel::parallel_apply(const nn::ModuleInput& input, const TensorSlots& slots,
                                                              const ScatteredInputs& scattered, size_t used) {
  auto start = Clock::now();
  std::vector<std::vector<Tensor>> outputs(used);
  report_.device_compute_ms.assign(device_ids_.size(), 0.0);
  pool_->run(used, [&](size_t i) {
    std::vector<Tensor> mine;
    for (const auto& per_tensor : scattered.chunks) mine.push_back(per_tensor[i]);
    std::vector<Tensor> out = replicas_[i]->forward_args(with_tensors(input, slots, mine));
    checkpoint_if_lost();  // before writing into this frame (core/lost_thread.h)
    outputs[i] = std::move(out);
    report_.device_compute_ms[i] = ms_since(start);  // Note [What the auto split measures]: from the phase's start
  });
  for (size_t i = 1; i < used; ++i) {
    DPE_CHECK(outputs[i].size() == outputs[0].size(), "DataParallel: replica ", i, " returned ", outputs[i].size(),
              " outputs, replica 0 returned ", outputs[0].size());
  }
  if (options_.buffers == BufferPolicy::Average) average_buffers(used);
  report_.forward_ms = ms_since(start);
  return outputs;
}

// Gathers output j of every replica on output_device (0-dim outputs: one value per replica). When a graph
// was recorded, the gathered outputs get one DataParallelGatherNode as grad_fn: backward runs there.
std::vector<Tensor> DataParallel::gather_outputs(std::vector<std::vector<Tensor>> outputs,
                                                 const ScatteredInputs& scattered, int64_t dim) {
  auto start = Clock::now();
  const size_t used = outputs.size(), num_outputs = outputs[0].size();
  std::vector<Tensor> gathered(num_outputs);
  std::vector<bool> scalar(num_outputs);
  bool any_graph = false;
  for (size_t j = 0; j < num_outputs; ++j) {
    std::vector<Tensor> parts;
    for (size_t i = 0; i < used; ++i) {
      parts.push_back(outputs[i][j].detach());
      any_graph = any_graph || outputs[i][j].requires_grad();
      if (outputs[i][j].device() != output_device_) report_.gather.bytes += static_cast<int64_t>(outputs[i][j].nbytes());
    }
    scalar[j] = parts[0].dim() == 0;
    NoGradGuard no_grad;
    gathered[j] = gather(parts, output_device_, scalar[j] ? 0 : dim);
  }
  if (GradMode::is_enabled() && any_graph) {
    auto node = std::make_shared<DataParallelGatherNode>(this, std::move(outputs), scattered.chunk_leaves,
                                                         scattered.grad_input_devices, report_.chunk_sizes, dim, scalar);
    for (const Tensor& x : scattered.grad_inputs) node->next_edges.push_back(autograd::gradient_edge(x));
    for (size_t j = 0; j < num_outputs; ++j) {
      auto& meta = autograd::meta_of(gathered[j]);
      meta.grad_fn = node;
      meta.output_nr = static_cast<int>(j);
    }
  }
  report_.gather_ms = ms_since(start);
  refresh_memory_report();
  return gathered;
}

}  // namespace dpe
