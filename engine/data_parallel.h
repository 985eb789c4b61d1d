// DataParallel: PyTorch's nn.DataParallel semantics with persistent replicas and worker threads.
//
//   auto model = std::make_shared<Mlp>();                         // on cpu:0 / cuda:0
//   DataParallel dp(model, {.device_ids = {Device::cpu(0), Device::cpu(1)}});
//   Tensor out = dp.forward(x);                                   // scatter, replicate, forward, gather
//   Tensor loss = cross_entropy(out, target);
//   loss.backward();                                              // replicas' backward + reduction
//   optimizer.step();                                             // on the master's parameters
//
// One DP step, exactly (see docs/DATA_PARALLEL.md):
//  1. The batch is split along `dim` by the split rule (PyTorch's chunk rule by default); chunk i goes to
//     device_ids[i]; used devices = the non-empty chunks.
//  2. Replicas 1..used-1 are brought up to date with the master by one coalesced broadcast of parameters
//     and buffers. Replicas persist: they are built once, at construction (replicas_created()).
//  3. Forward runs on every used device in parallel, each on its device's persistent worker thread.
//  4. Outputs are gathered on output_device along dim, in input order.
//  5. loss.backward() reaches the gathered output's node, which runs every replica's backward in parallel on
//     the workers; gradients are summed into the master's .grad bucket by bucket as soon as a bucket is ready
//     on every replica (Note [DP reduction overlap] in engine/gradient_reducer.h).
// Replica 0 is the master module itself, so its buffer updates (BatchNorm running stats) persist, like
// PyTorch; BufferPolicy::Average averages the used replicas' floating-point buffers into the master instead.
// With one device nothing is broadcast or reduced: forward is the module's own, bit for bit.
//
// Thread-safety: one thread drives a DataParallel at a time.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "core/allocator.h"
#include "engine/gradient_reducer.h"
#include "engine/worker_pool.h"
#include "layers/module.h"
#include "scatter_gather/chunking.h"
#include "scatter_gather/coalesced.h"

namespace dpe {

enum class ParallelMode { DP };  // DDP joins here (issue "DDP mode")
enum class BufferPolicy { Replica0, Average };

struct DataParallelOptions {
  // Default (nullopt): every CUDA device if there is one, else every CPU device. An explicit list must be
  // non-empty, of one kind, without duplicates, of existing devices.
  std::optional<std::vector<Device>> device_ids;
  std::optional<Device> output_device;  // default device_ids[0]; any existing device (CPU included)
  int64_t dim = 0;
  SplitRule split = SplitRule::Chunk;
  std::vector<double> split_weights;  // SplitRule::Weighted only, one per device
  ParallelMode mode = ParallelMode::DP;
  BufferPolicy buffers = BufferPolicy::Replica0;
  size_t bucket_bytes = kDefaultBucketBytes;
};

// What the last step did. Times are host wall-clock milliseconds per phase (on CUDA, work is asynchronous:
// a phase's time includes waiting for earlier work that its copies depend on).
struct StepReport {
  std::vector<int64_t> chunk_sizes;
  std::vector<Device> used_devices;
  double scatter_ms = 0, broadcast_ms = 0, forward_ms = 0, gather_ms = 0, backward_ms = 0, reduce_ms = 0;
  TransferStats scatter, broadcast, gather, reduce;
  int64_t buckets = 0;
  int64_t buckets_reduced_during_backward = 0;
  std::vector<std::pair<Device, MemoryStats>> memory;  // per device_ids entry, after the step
};

class DataParallel {
 public:
  DataParallel(std::shared_ptr<nn::Module> module, DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // input: (..., B along dim, ...) on any device. Returns the gathered output on output_device.
  // The module must implement forward(const Tensor&) (or forward_args returning one tensor).
  Tensor forward(const Tensor& input);
  // Structured form: every tensor argument (positional or named) is split along dim (they must agree on
  // the size there), every other value goes unchanged to each used replica; the module's forward_args runs
  // on each replica and each of its outputs is gathered on output_device (0-dim outputs become a vector of
  // one value per replica, with a one-time warning, like PyTorch). With no tensor argument, the module runs
  // once, on device_ids[0].
  std::vector<Tensor> forward_args(const nn::ModuleInput& input);

  nn::Module& module() { return *replicas_[0]; }  // the master
  std::shared_ptr<nn::Module> module_ptr() { return replicas_[0]; }
  std::vector<Tensor> parameters() const { return replicas_[0]->parameters(); }
  const std::vector<Device>& device_ids() const { return device_ids_; }
  const Device& output_device() const { return output_device_; }
  const DataParallelOptions& options() const { return options_; }

  const StepReport& last_step() const { return report_; }
  // Counters for the persistence guarantees: constant after construction.
  int64_t replicas_created() const { return replicas_created_; }
  int64_t threads_created() const { return pool_->threads_created(); }
  size_t num_buckets() const { return reducer_ ? reducer_->num_buckets() : 0; }

 private:
  friend class DataParallelGatherNode;
  void validate_devices();
  void check_master_placement() const;
  void sync_replicas(size_t used);
  void average_buffers(size_t used);
  void refresh_memory_report();

  DataParallelOptions options_;
  std::vector<Device> device_ids_;
  Device output_device_;
  std::vector<std::shared_ptr<nn::Module>> replicas_;  // [0] is the master
  // Parameters and buffers of each replica (state_dict order) and their names, taken once at construction:
  // handles stay valid across Module::to and set_data, so steps need no state_dict() walk. Like PyTorch's
  // DDP, registering new parameters after construction is not seen by the engine.
  std::vector<std::vector<Tensor>> replica_state_;
  std::vector<std::string> state_names_;
  std::unique_ptr<DeviceWorkerPool> pool_;
  std::unique_ptr<GradientReducer> reducer_;
  int64_t replicas_created_ = 0;
  StepReport report_;
};

}  // namespace dpe
