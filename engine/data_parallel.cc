// DataParallel's construction (devices, replicas, the mode's reducer) and what both modes share. The DP
// step is in dp_mode.cc, the DDP mode's construction and step in ddp_mode.cc, the step API in train_step.cc,
// what both modes do across processes in across_processes.cc.
#include "engine/data_parallel.h"

#include <set>

#include "core/error.h"
#include "engine/ddp_reducer.h"
#include "engine/gradient_reducer.h"
#include "engine/worker_pool.h"

namespace dpe {

const char* mode_name(ParallelMode mode) {
  switch (mode) {
    case ParallelMode::DP: return "dp";
    case ParallelMode::DDP: return "ddp";
    case ParallelMode::Auto: return "auto";
  }
  return "?";
}

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, DataParallelOptions options)
    : options_(std::move(options)) {
  DPE_CHECK(module != nullptr, "DataParallel: module is null");
  init({std::move(module)});
}

DataParallel::DataParallel(std::vector<std::shared_ptr<nn::Module>> replicas, DataParallelOptions options)
    : options_(std::move(options)) {
  DPE_CHECK(options_.mode == ParallelMode::DDP, "DataParallel: a list of replicas is DDP mode's constructor; "
            "DP mode replicates one module");
  DPE_CHECK(!replicas.empty(), "DataParallel: the replica list is empty");
  for (size_t i = 0; i < replicas.size(); ++i) DPE_CHECK(replicas[i] != nullptr, "DataParallel: replica ", i, " is null");
  init(std::move(replicas));
}

// given: the master alone (replicas cloned from it), or one replica per device (DDP).
void DataParallel::init(std::vector<std::shared_ptr<nn::Module>> given) {
  if (options_.mode == ParallelMode::Auto) {
    DPE_CHECK(!spans_processes(options_.backend), "DataParallel: mode auto switches modes, which is not supported "
              "across processes (backend '", backend_name(options_.backend), "'); expected dp or ddp");
    auto_mode_ = std::make_unique<AutoModeState>();
    options_.mode = ParallelMode::DP;  // measured first
  }
  validate_devices();
  DPE_CHECK(given.size() == 1 || given.size() == device_ids_.size(), "DataParallel: ", given.size(),
            " replicas for ", device_ids_.size(), " devices; expected one per device_ids entry");
  replicas_.push_back(std::move(given[0]));
  for (size_t i = 0; i < device_ids_.size(); ++i) {
    if (i > 0) {
      if (given.size() > 1) {
        replicas_.push_back(std::move(given[i]));
      } else {
        replicas_.push_back(replicas_[0]->clone(device_ids_[i]));
        ++replicas_created_;
      }
    }
    std::vector<Tensor> state;
    for (auto& [name, t] : replicas_[i]->state_dict()) {
      state.push_back(t);
      if (i == 0) state_names_.push_back(name);
    }
    replica_state_.push_back(std::move(state));
    replica_buffers_.push_back(replicas_[i]->buffers());
    std::vector<Tensor> params;
    for (auto& [name, p] : replicas_[i]->named_parameters()) {
      params.push_back(p);
      if (i == 0) {
        param_names_.push_back(name);
        trainable_.push_back(p.requires_grad());
      }
    }
    replica_params_.push_back(std::move(params));
    if (i == 0) check_master_placement();  // before cloning a misplaced master
  }
  check_deterministic_options();
  pool_ = make_pool();
  try {
    if (options_.mode == ParallelMode::DDP) init_ddp();
    if (options_.mode == ParallelMode::DP && spans_processes(options_.backend)) init_dp_across_processes();
    build_reducer();
  } catch (...) {
    // No destructor runs for a constructor that throws: what a worker lost in init_ddp's broadcast may still
    // reach is kept alive here (Note [Lost workers] in engine/worker_pool.cc).
    abandon_to_lost_workers();
    throw;
  }
}

void DataParallel::build_reducer() {
  std::vector<std::vector<Tensor>> params(replicas_.size());
  std::vector<std::string> names;
  for (size_t k = 0; k < trainable_.size(); ++k) {
    if (!trainable_[k]) continue;
    for (size_t r = 0; r < replicas_.size(); ++r) params[r].push_back(replica_params_[r][k]);
    names.push_back(param_names_[k]);
  }
  if (options_.mode == ParallelMode::DDP) {
    DdpReducerOptions reducer_options{.find_unused_parameters = options_.find_unused_parameters,
                                      .reduce_dtype = options_.reduce_dtype};
    if (options_.bucket_cap_mb.has_value()) {
      reducer_options.bucket_cap_bytes = static_cast<size_t>(*options_.bucket_cap_mb * 1024 * 1024);
      reducer_options.first_bucket_bytes = reducer_options.bucket_cap_bytes;
    }
    // Its hooks go before the new reducer's are registered (kept for a lost worker, they stay disarmed).
    retire(std::shared_ptr<DdpReducer>(std::move(ddp_reducer_)));
    ddp_reducer_ = std::make_unique<DdpReducer>(std::move(params), std::move(names), group_, reducer_options);
  } else if (device_ids_.size() > 1) {
    retire(std::shared_ptr<GradientReducer>(std::move(reducer_)));
    reducer_ =
        std::make_unique<GradientReducer>(std::move(params), device_ids_, options_.bucket_bytes, options_.timeout);
  }
}

// Note [Frozen parameters]
void DataParallel::refresh_trainable() {
  bool changed = false;
  for (size_t k = 0; k < trainable_.size(); ++k) {
    const bool master = replica_params_[0][k].requires_grad();
    changed = changed || master != trainable_[k];
    for (size_t r = 1; r < replicas_.size(); ++r) {
      const bool mine = replica_params_[r][k].requires_grad();
      DPE_CHECK(mine == trainable_[k] || master != trainable_[k], "DataParallel: requires_grad of replica ", r,
                "'s '", param_names_[k], "' was set to ", mine ? "true" : "false", " but the master's (replica 0's) is ",
                master ? "true" : "false", "; change it on module() (replica 0): the engine copies the master's flags "
                "to every replica at the next step");
    }
  }
  if (!changed) return;
  for (size_t k = 0; k < trainable_.size(); ++k) {
    trainable_[k] = replica_params_[0][k].requires_grad();
    for (size_t r = 1; r < replicas_.size(); ++r) {
      replica_params_[r][k].set_requires_grad(trainable_[k]);
      // DP's replica gradients are the engine's scratch, one step long: none is left on a frozen parameter.
      if (options_.mode == ParallelMode::DP && !trainable_[k]) replica_params_[r][k].set_grad({});
    }
  }
  build_reducer();
}

DataParallel::~DataParallel() { abandon_to_lost_workers(); }

int64_t DataParallel::threads_created() const { return pool_->threads_created(); }

size_t DataParallel::num_buckets() const { return reducer_ ? reducer_->num_buckets() : 0; }

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
  if (options_.split == SplitRule::Auto) auto_split_ = std::make_unique<AutoSplit>(static_cast<int>(device_ids_.size()));
  if (const std::optional<DType> wire = options_.reduce_dtype) {
    DPE_CHECK(*wire == DType::Float32 || *wire == DType::BFloat16 || *wire == DType::Float16,
              "DataParallel: reduce_dtype ", *wire, " is not float32, bfloat16 or float16");
    DPE_CHECK(options_.backend != CollectiveBackend::Mpi || *wire == DType::Float32, "DataParallel: reduce_dtype ",
              *wire, " cannot cross processes on the mpi backend (MPI has no ", *wire,
              " sum); use the mpi-nccl backend on CUDA devices, or float32");
    DPE_CHECK(!options_.deterministic, "DataParallel: reduce_dtype ", *wire, " applies to DDP's bucket all-reduce, "
              "which the deterministic mode does not use (it sums shard gradients in float32 in a fixed order)");
  }
}

std::vector<int64_t> DataParallel::chunk_sizes(int64_t batch) const {
  const int64_t n = static_cast<int64_t>(device_ids_.size());
  // The auto split keeps every device in use once the batch has a sample for each.
  if (!auto_split_ || batch < n * AutoSplit::kMinChunk) {
    return compute_chunk_sizes(batch, n, auto_split_ ? SplitRule::Chunk : options_.split, options_.split_weights);
  }
  return auto_split_->sizes(batch);
}

// Note [What the auto split measures]
// A device's time in a step is how long after the step (or, in DP, each phase) began it finished its part:
// the end of its forward and of its backward in DP and in the deterministic mode, and in DDP the moment it
// entered its last collective (after which it only waits for the others). Measured from the common start,
// not from when its own task began, and without subtracting the waits on the way, because what the split must
// equalise is when devices arrive. The earlier measure (each task's own forward + loss + backward, minus its
// all-reduce waits) is right for devices with nothing in common, but devices that share a core made it lie
// both ways: a task that starts while its partners hold the core does not count that delay, and while one
// device waits in a collective its partners run faster, so every device of a shared core looked faster than
// the core is. With `DPE_CPU_DEVICE_CORES="0;0;0;1"` (CNN, batch 256) the weights settled at cpu:3 0.42-0.44
// instead of about 0.5 and the auto split ran 1.19-1.33x the even split; measured this way cpu:3 gets
// 0.44-0.49 and the split 1.30-1.48x (docs/BENCHMARKS.md). The cost: waits in earlier collectives (a fast
// device held at bucket k by a slow one) count, pulling the measured times of unequal devices towards each
// other, so the split converges in more re-solves; it converges to the same point, where they arrive together.
void DataParallel::observe_split() {
  if (!auto_split_) return;
  std::vector<int64_t> samples = report_.chunk_sizes;
  samples.resize(device_ids_.size(), 0);
  report_.device_compute_ms.resize(device_ids_.size(), 0.0);
  const std::vector<double> before = auto_split_->weights();
  auto_split_->observe(samples, report_.device_compute_ms);
  // DDP's all-reduce follows the split too: each member reduces a part of every bucket proportional to its
  // device's speed (ProcessGroup::set_work_shares), or the slow devices would still do an equal part.
  if (group_ && auto_split_->weights() != before) group_->set_work_shares(auto_split_->weights());
  report_.split_weights = auto_split_->weights();
  report_.ms_per_sample = auto_split_->ms_per_sample();
}

void DataParallel::check_master_placement() const {
  for (size_t k = 0; k < replica_state_[0].size(); ++k) {
    const Device& d = replica_state_[0][k].device();
    DPE_CHECK(d == device_ids_[0], "DataParallel: module must have its parameters and buffers on device_ids[0] = ",
              device_ids_[0], " but '", state_names_[k], "' is on ", d, "; move it with module->to(", device_ids_[0],
              ")");
  }
}
void DataParallel::refresh_memory_report() {
  report_.memory.clear();
  for (const Device& d : device_ids_) report_.memory.emplace_back(d, memory_stats(d));
}
}  // namespace dpe
