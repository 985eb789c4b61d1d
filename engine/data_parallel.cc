#include "engine/data_parallel.h"

#include <chrono>
#include <set>

#include "core/autograd/engine.h"
#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"
#include "core/error.h"
#include "core/ops.h"
#include "scatter_gather/scatter_gather.h"

namespace dpe {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::vector<Tensor> state_tensors(const nn::Module& m) {
  std::vector<Tensor> out;
  for (const auto& [name, t] : m.state_dict()) out.push_back(t);
  return out;
}

}  // namespace

// The grad_fn of a DP step's gathered output: loss.backward() lands here with the gradient of the whole
// gathered output, and this node runs the replicas' backward passes in parallel, then completes the
// reduction into the master (Note [DP reduction overlap]). Its only edge leads to the step's input, when that
// input requires grad. Contract: the DataParallel outlives the backward of its outputs.
class DataParallelGatherNode final : public autograd::Node {
 public:
  DataParallelGatherNode(DataParallel* dp, std::vector<Tensor> outputs, std::vector<Tensor> chunk_inputs,
                         std::vector<int64_t> sizes, int64_t dim, Device input_device)
      : dp_(dp),
        outputs_(std::move(outputs)),
        chunk_inputs_(std::move(chunk_inputs)),
        sizes_(std::move(sizes)),
        dim_(dim),
        input_device_(input_device) {}

  std::string name() const override { return "DataParallelGatherBackward"; }
  void release_saved() override {
    outputs_.clear();
    chunk_inputs_.clear();
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    DPE_CHECK(!outputs_.empty(), "backward through a DataParallel step a second time: its graph was freed");
    const Tensor& g = grads[0];
    size_t used = outputs_.size();
    std::vector<Tensor> pieces = g.split(sizes_, dim_);
    for (size_t i = 0; i < used; ++i) pieces[i] = pieces[i].to(outputs_[i].device());

    auto start = Clock::now();
    dp_->reducer_->prepare(used);
    try {
      dp_->pool_->run(used, [&](size_t i) {
        if (outputs_[i].requires_grad()) autograd::backward({outputs_[i]}, {pieces[i]});
      });
    } catch (...) {
      dp_->reducer_->finish();  // disarm; the master's gradient of this step is incomplete anyway
      throw;
    }
    dp_->report_.backward_ms = ms_since(start);
    auto reduce_start = Clock::now();
    dp_->report_.reduce = dp_->reducer_->finish();
    dp_->report_.reduce_ms = ms_since(reduce_start);  // what was left after backward; the rest overlapped
    dp_->report_.buckets = static_cast<int64_t>(dp_->reducer_->num_buckets());
    dp_->report_.buckets_reduced_during_backward = dp_->reducer_->buckets_reduced_early();
    dp_->refresh_memory_report();

    std::vector<Tensor> input_grad(next_edges.size());
    if (!next_edges.empty()) {
      std::vector<Tensor> chunk_grads;
      for (size_t i = 0; i < used; ++i) {
        const Tensor& c = chunk_inputs_[i];
        chunk_grads.push_back(c.grad().defined() ? c.grad() : zeros(c.shape(), TensorOptions(c.dtype()).with_device(c.device())));
      }
      input_grad[0] = gather(chunk_grads, input_device_, dim_);
    }
    return input_grad;
  }

 private:
  DataParallel* dp_;
  std::vector<Tensor> outputs_;
  std::vector<Tensor> chunk_inputs_;
  std::vector<int64_t> sizes_;
  int64_t dim_;
  Device input_device_;
};

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, DataParallelOptions options)
    : options_(std::move(options)) {
  DPE_CHECK(module != nullptr, "DataParallel: module is null");
  validate_devices();
  replicas_.push_back(std::move(module));
  check_master_placement();
  for (size_t i = 1; i < device_ids_.size(); ++i) {
    replicas_.push_back(replicas_[0]->clone(device_ids_[i]));
    ++replicas_created_;
  }
  pool_ = std::make_unique<DeviceWorkerPool>(device_ids_);
  if (device_ids_.size() > 1) {
    std::vector<std::vector<Tensor>> params;
    for (const auto& r : replicas_) params.push_back(r->parameters());
    reducer_ = std::make_unique<GradientReducer>(std::move(params), options_.bucket_bytes);
  }
}

DataParallel::~DataParallel() = default;

void DataParallel::validate_devices() {
  if (!options_.device_ids.has_value()) {
    device_ids_ = cuda_available() ? all_devices(DeviceKind::CUDA) : all_devices(DeviceKind::CPU);
  } else {
    device_ids_ = *options_.device_ids;
    DPE_CHECK(!device_ids_.empty(), "DataParallel: device_ids is empty; expected at least one device (or leave it "
              "unset for every visible device)");
  }
  std::set<Device> seen;
  for (const Device& d : device_ids_) {
    DPE_CHECK(d.kind == device_ids_[0].kind, "DataParallel: device_ids mixes ", device_ids_[0], " and ", d,
              "; all devices must be of one kind");
    DPE_CHECK(seen.insert(d).second, "DataParallel: device_ids contains ", d, " more than once");
    try {
      check_device_exists(d);
    } catch (const Error& e) {
      throw Error(detail::str_cat("DataParallel: device_ids: ", e.what()));  // keeps the original's location
    }
  }
  output_device_ = options_.output_device.value_or(device_ids_[0]);
  try {
    check_device_exists(output_device_);
  } catch (const Error& e) {
    throw Error(detail::str_cat("DataParallel: output_device: ", e.what()));
  }
  DPE_CHECK(options_.split != SplitRule::Weighted || options_.split_weights.size() == device_ids_.size(),
            "DataParallel: the weighted split needs one weight per device (", device_ids_.size(), "), got ",
            options_.split_weights.size());
}

void DataParallel::check_master_placement() const {
  for (const auto& [name, t] : replicas_[0]->state_dict()) {
    DPE_CHECK(t.device() == device_ids_[0], "DataParallel: module must have its parameters and buffers on "
              "device_ids[0] = ", device_ids_[0], " but '", name, "' is on ", t.device(),
              "; move it with module->to(", device_ids_[0], ")");
  }
}

void DataParallel::sync_replicas(size_t used) {
  if (used <= 1) return;
  std::vector<std::vector<Tensor>> destinations;
  for (size_t r = 1; r < used; ++r) destinations.push_back(state_tensors(*replicas_[r]));
  report_.broadcast = broadcast_coalesced_into(state_tensors(*replicas_[0]), destinations, options_.bucket_bytes);
}

void DataParallel::average_buffers(size_t used) {
  NoGradGuard no_grad;
  std::vector<std::vector<Tensor>> per_replica(used);
  std::vector<Tensor> master;
  for (size_t r = 0; r < used; ++r) {
    for (const Tensor& b : replicas_[r]->buffers()) {
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

void DataParallel::refresh_memory_report() {
  report_.memory.clear();
  for (const Device& d : device_ids_) report_.memory.emplace_back(d, memory_stats(d));
}

Tensor DataParallel::forward(const Tensor& input) {
  DPE_CHECK(input.defined(), "DataParallel::forward: undefined input");
  DPE_CHECK(input.dim() > 0, "DataParallel::forward: cannot split a 0-dim input along dim ", options_.dim);
  check_master_placement();
  int64_t dim = normalize_dim(options_.dim, input.dim(), "DataParallel");
  report_ = StepReport{};

  if (device_ids_.size() == 1) {  // no replication, no reduction: the module itself
    report_.chunk_sizes = {input.size(dim)};
    report_.used_devices = device_ids_;
    auto start = Clock::now();
    Tensor out = replicas_[0]->forward(input.to(device_ids_[0])).to(output_device_);
    report_.forward_ms = ms_since(start);
    refresh_memory_report();
    return out;
  }

  auto start = Clock::now();
  report_.chunk_sizes =
      compute_chunk_sizes(input.size(dim), static_cast<int64_t>(device_ids_.size()), options_.split, options_.split_weights);
  size_t used = report_.chunk_sizes.size();
  report_.used_devices.assign(device_ids_.begin(), device_ids_.begin() + static_cast<int64_t>(used));
  bool record = GradMode::is_enabled();
  bool input_needs_grad = record && input.requires_grad();
  std::vector<Tensor> chunks;
  {
    NoGradGuard no_grad;
    chunks = scatter(input.detach(), report_.used_devices, dim, report_.chunk_sizes);
  }
  for (size_t i = 0; i < used; ++i) {
    if (chunks[i].device() != input.device()) report_.scatter.bytes += static_cast<int64_t>(chunks[i].nbytes());
    if (input_needs_grad) chunks[i] = chunks[i].detach().set_requires_grad(true);
  }
  report_.scatter_ms = ms_since(start);

  start = Clock::now();
  sync_replicas(used);
  report_.broadcast_ms = ms_since(start);

  start = Clock::now();
  std::vector<Tensor> outputs(used);
  pool_->run(used, [&](size_t i) { outputs[i] = replicas_[i]->forward(chunks[i]); });
  if (options_.buffers == BufferPolicy::Average) average_buffers(used);
  report_.forward_ms = ms_since(start);

  start = Clock::now();
  Tensor gathered;
  {
    NoGradGuard no_grad;
    std::vector<Tensor> detached;
    for (const Tensor& o : outputs) detached.push_back(o.detach());
    gathered = gather(detached, output_device_, dim);
  }
  for (const Tensor& o : outputs) {
    if (o.device() != output_device_) report_.gather.bytes += static_cast<int64_t>(o.nbytes());
  }
  bool any_graph = false;
  for (const Tensor& o : outputs) any_graph = any_graph || o.requires_grad();
  if (record && any_graph) {
    auto node = std::make_shared<DataParallelGatherNode>(this, outputs, input_needs_grad ? chunks : std::vector<Tensor>{},
                                                         report_.chunk_sizes, dim, input.device());
    if (input_needs_grad) node->next_edges.push_back(autograd::gradient_edge(input));
    auto& meta = autograd::meta_of(gathered);
    meta.grad_fn = node;
    meta.output_nr = 0;
  }
  report_.gather_ms = ms_since(start);
  refresh_memory_report();
  return gathered;
}

}  // namespace dpe
