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
// One DDP step (forward_backward in DDP mode; engine/ddp_reducer.h has the reduction's rules):
//  1. Input and target are split by the same rule; a device past the batch's chunks gets no sample: its
//     replica runs no forward or backward but contributes zeros (weight 0) to every all-reduce, so PyTorch's
//     uneven-inputs problem does not arise (not with SyncBatchNorm, which needs a sample on every replica).
//  2. On every worker at once: replica 0's buffers are broadcast (broadcast_buffers), the replica runs
//     forward and the loss on its own shard, then backward; each gradient is weighted by its shard's share of
//     the batch and all-reduced in buckets as soon as a bucket is complete, while backward goes on.
//  3. optimizer_step runs every replica's own optimizer on its worker; replicas stay bit-identical because
//     they start identical (broadcast at construction) and see identical averaged gradients.
//
// Note [Frozen parameters]
// A parameter whose requires_grad is false (a frozen backbone while fine-tuning) is PyTorch's frozen
// parameter in both modes: replicas keep the flag (clone copies it), it gets no gradient, it is left out of
// DP's reduction and DDP's buckets (so it is never an "unused parameter"), and optimizers skip it, so it stays
// bit-identical. The master's (replica 0's) flags are the model's: a change made to them after construction
// is picked up at the next step (the flags are copied to every replica and the reducer is rebuilt); a change
// made to another replica alone is refused with an error naming the replica and the parameter. DDP replicas
// built by the caller must agree with replica 0's flags at construction.
//
// Thread-safety: one thread drives a DataParallel at a time.
#pragma once

#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "core/allocator.h"
#include "engine/replica_error.h"
#include "layers/loss.h"
#include "layers/module.h"
#include "optim/optimizer.h"
#include "scatter_gather/auto_split.h"
#include "scatter_gather/chunking.h"
#include "scatter_gather/coalesced.h"
#include "collectives/process_group.h"

namespace dpe {

// DP: nn.DataParallel (master replica, per-step broadcast, reduce into the master, one optimizer).
// DDP: DistributedDataParallel's algorithm over the same worker threads (persistent replicas, each computes
// its own loss, bucketed all-reduce during backward, one optimizer per replica). See docs/DATA_PARALLEL.md.
// Auto (construction only): train_step times a few steps in DP mode, then as many in DDP mode, and keeps the
// faster (StepReport::auto_mode says which, with both times). Switching is DataParallel::set_mode.
enum class ParallelMode { DP, DDP, Auto };
const char* mode_name(ParallelMode mode);
enum class BufferPolicy { Replica0, Average };
// What the step API does when one replica fails (docs/DATA_PARALLEL.md "A failed device"):
//   Fail               rethrow its ReplicaError (PyTorch's behaviour);
//   DropDevice         drop that device (its replica, optimizer, worker), rebuild the group over the
//                      survivors, and redo the same step on them: nothing rolls back, since the optimizer has
//                      not run and DP's master / DDP's identical replicas hold the parameters;
//   RetrySmallerChunk  on an out-of-memory error, halve that device's share of the batch and redo the step
//                      (other errors are rethrown).
enum class DeviceFailurePolicy { Fail, DropDevice, RetrySmallerChunk };

struct DataParallelOptions {
  // Default (nullopt): every CUDA device if there is one, else every CPU device. An explicit list must be
  // non-empty, of one kind, without duplicates, of existing devices.
  std::optional<std::vector<Device>> device_ids;
  std::optional<Device> output_device;  // default device_ids[0]; any existing device (CPU included)
  int64_t dim = 0;
  SplitRule split = SplitRule::Chunk;
  std::vector<double> split_weights;  // SplitRule::Weighted only, one per device
  ParallelMode mode = ParallelMode::DP;
  // DP mode: which buffers the master keeps; the byte cap of DP's coalesced broadcasts and reductions.
  BufferPolicy buffers = BufferPolicy::Replica0;
  size_t bucket_bytes = kDefaultBucketBytes;
  // DDP mode, with PyTorch DistributedDataParallel's names and defaults.
  bool broadcast_buffers = true;        // replica 0's buffers to every replica before each synchronised forward
  bool find_unused_parameters = false;
  // Gradient bucket cap; unset: 25 MiB with a 1 MiB first bucket after the rebuild (PyTorch's defaults),
  // set: that cap for every bucket.
  std::optional<double> bucket_cap_mb;
  // DDP mode: the dtype gradient buckets travel in. Unset: the gradients' own (float32). bfloat16 halves
  // the bytes all-reduced, like PyTorch's bf16_compress_hook: each replica's weighted bucket is rounded to
  // bfloat16, summed in float32 and rounded once more, then written back into the float32 gradients (about 3
  // significant digits; docs/MIXED_PRECISION.md). float16 likewise (range 6e-5..65504: gradients outside it
  // flush to 0 or overflow). Not across processes on the mpi backend (MPI has no 16-bit float sum).
  std::optional<DType> reduce_dtype;
  // DDP mode's collectives. Mpi (or MpiNccl, through NCCL for CUDA devices): across the processes of an MPI
  // launch (docs/SCALE_OUT.md), in DDP mode the replicas of every process form one group (this process's
  // device_ids in each; parameters broadcast from global rank 0, gradients averaged over all of them); in DP
  // mode each process's master joins a group of masters whose gradients are averaged after each synchronised
  // backward of the step API. Every process
  // constructs its DataParallel at the same point.
  CollectiveBackend backend = CollectiveBackend::Auto;
  // A replica that never arrives: the collectives' timeout, and the straggler timeout after which a replica
  // still running when another has finished is declared lost (docs/DATA_PARALLEL.md "A failed device").
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Bitwise-reproducible steps whatever the device count and mode (engine/deterministic_step.cc,
  // docs/DATA_PARALLEL.md "Deterministic mode"): the step API cuts every batch into virtual_shards fixed
  // shards (0: max(4, devices)), runs each alone on whichever device, and sums their gradients in a fixed
  // tree by shard index. CPU devices, one process.
  bool deterministic = false;
  int64_t virtual_shards = 0;
  DeviceFailurePolicy on_device_failure = DeviceFailurePolicy::Fail;
};

// What the last step did. Times are host wall-clock milliseconds per phase (on CUDA, work is asynchronous:
// a phase's time includes waiting for earlier work that its copies depend on).
// backward_ms is the whole backward, gradient reduction included; reduce_ms the part of it spent reducing (DP:
// what was left after the replicas' backward; DDP: inside the overlapped all-reduces).
// DDP mode: phases run on every replica at once; a phase's time is the slowest replica's. broadcast is the buffer
// broadcast; reduce.bytes is the gradient bytes all-reduced, summed over replicas; reduce.transfers the
// all-reduce calls.
struct StepReport {
  ParallelMode mode = ParallelMode::DP;
  std::vector<int64_t> chunk_sizes;
  std::vector<Device> used_devices;
  double scatter_ms = 0, broadcast_ms = 0, forward_ms = 0, gather_ms = 0, loss_ms = 0, backward_ms = 0,
         reduce_ms = 0, optimizer_ms = 0;
  TransferStats scatter, broadcast, gather, reduce;
  int64_t buckets = 0;
  int64_t buckets_reduced_during_backward = 0;
  double loss = std::numeric_limits<double>::quiet_NaN();  // forward_backward: the batch's loss
  // ParallelMode::Auto: the median train_step time of each mode measured so far (0 before any), and the
  // choice once both are measured.
  struct AutoMode {
    double dp_step_ms = 0, ddp_step_ms = 0;
    std::optional<ParallelMode> chosen;
  };
  std::optional<AutoMode> auto_mode;
  // Per device_ids entry: when it finished its part of this step, in milliseconds from the step's start (DP:
  // its forward and its backward, each from its phase's start; DDP: until it entered its last collective), 0
  // for an unused device; what the auto split measures (Note [What the auto split measures]); step API only.
  std::vector<double> device_compute_ms;
  // SplitRule::Auto: the weights the step's chunk sizes came from (updated after the step) and each
  // device's smoothed time per sample in milliseconds; empty otherwise.
  std::vector<double> split_weights, ms_per_sample;
  // What on_device_failure recovered from during this step, in order ("dropped cpu:1 (replica 1): <error>;
  // the step was redone on cpu:0 cpu:2"); empty when nothing failed.
  std::vector<std::string> recovered_failures;
  std::vector<std::pair<Device, MemoryStats>> memory;  // per device_ids entry, after the step
  // With a GradScaler (DataParallel::set_grad_scaler): the scale this step's backward used (1 without one)
  // and whether optimizer_step skipped the update because a gradient held an inf or NaN.
  double loss_scale = 1.0;
  bool skipped_step = false;
};

// LossFn (layers/loss.h): the loss of a batch (DP: the gathered output, on output_device) or of one replica's
// shard (DDP: on the replica's device, run on its worker thread, so it must be thread-safe): a 0-dim tensor.
// Makes an optimizer over the given parameters: DP calls it once (master), DDP once per replica.
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>& params)>;

class DataParallel;
namespace optim {
class GradScaler;  // optim/grad_scaler.h; include it to make one
}  // namespace optim
// The engine's internals (engine/*.h beside this one, private to engine/ by Bazel visibility): declared, not
// included, so that a user of DataParallel compiles against this header and replica_error.h alone.
class DeviceWorkerPool;
class GradientReducer;
class DdpReducer;
namespace detail {
struct TensorSlots;  // where a step's tensor arguments are (dp_mode.cc)
}  // namespace detail

// DDP's no_sync(): while alive, backward passes accumulate gradients locally without any collective; the
// next synchronised backward reduces the accumulated gradients. In DP mode gradients always land in the
// master, so accumulation needs nothing and the guard changes nothing; in the deterministic mode every
// backward sums its shards (engine/deterministic_step.cc), so the guard changes nothing there either.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(DataParallel& dp);
  ~NoSyncGuard();
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  DataParallel& dp_;
  bool previous_;
};

class DataParallel {
 public:
  DataParallel(std::shared_ptr<nn::Module> module, DataParallelOptions options = {});
  // DDP mode with replicas built by the caller (one per device_ids entry, on that device; e.g. each from its
  // own seed): their parameter names and shapes are verified against replica 0's and replica 0's values are
  // broadcast to all, like PyTorch's DDP constructor.
  DataParallel(std::vector<std::shared_ptr<nn::Module>> replicas, DataParallelOptions options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // input: (..., B along dim, ...) on any device. Returns the gathered output on output_device.
  // The module must implement forward(const Tensor&) (or forward_args returning one tensor).
  // DDP mode: evaluation only (gradients disabled); training goes through forward_backward, where every
  // replica computes its own loss.
  Tensor forward(const Tensor& input);
  // Structured form: every tensor argument (positional or named) is split along dim (they must agree on
  // the size there), every other value goes unchanged to each used replica; the module's forward_args runs
  // on each replica and each of its outputs is gathered on output_device (0-dim outputs become a vector of
  // one value per replica, with a one-time warning, like PyTorch). With no tensor argument, the module runs
  // once, on device_ids[0].
  std::vector<Tensor> forward_args(const nn::ModuleInput& input);

  // ---- The step API, identical in both modes (so DP and DDP are compared on exactly the same work) ----
  // Splits input and target along dim, runs forward, the loss, backward and the gradient reduction. DP: the
  // loss of the gathered output on output_device, gradients reduced into the master. DDP: each replica's
  // loss on its own shard, gradients averaged over replicas, each weighted by its shard's share of the
  // global batch (so uneven shards give the full-batch mean, as DP; PyTorch's DDP would average the replicas'
  // means). Gradients accumulate (call zero_grad between steps). Returns the batch loss (DDP: the shards'
  // losses weighted by shard size; across processes, backends 'mpi' and 'mpi-nccl': over every process's
  // batch, outside no_sync, so that every process returns the same).
  double forward_backward(const Tensor& input, const Tensor& target, const LossFn& loss);
  void set_optimizer(const OptimizerFactory& make);
  void optimizer_step();  // DP: the master's optimizer; DDP: every replica's, in parallel on the workers
  void zero_grad();       // gradients of the replicas the mode owns become undefined
  // zero_grad + forward_backward + optimizer_step. Not inside no_sync.
  double train_step(const Tensor& input, const Tensor& target, const LossFn& loss);
  // Dynamic loss scaling for the step API (PyTorch's GradScaler recipe; null: none, the default). While set,
  // forward_backward backpropagates scaler.scale(loss) (the loss it returns stays unscaled) and
  // optimizer_step unscales the gradients, skips the update when one holds an inf or NaN, and calls
  // scaler.update() once. DP: the master's optimizer goes through the scaler. DDP: every replica unscales its
  // own gradients and the found-inf flags are combined (max) over every replica of every process, so that
  // every replica steps or none does (Note [One skip decision] in engine/grad_scaling.cc). StepReport says
  // loss_scale and skipped_step. To clip gradients, call scaler.unscale_(optimizer(r)) for every optimizer
  // between forward_backward and optimizer_step (PyTorch's recipe); optimizer_step then uses the flags
  // unscale_ recorded instead of unscaling again. forward() plus a hand-written backward do not use it: call
  // scaler.scale(loss).backward(), scaler.step(dp.optimizer()) and scaler.update() there, as with one device.
  // A scaler drives one engine at a time (its update() runs once per optimizer_step here).
  void set_grad_scaler(std::shared_ptr<optim::GradScaler> scaler);
  optim::GradScaler* grad_scaler() const { return scaler_.get(); }
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  bool require_backward_grad_sync() const { return require_backward_grad_sync_; }

  // The mode steps run in now (DP or DDP; with Auto, the one being measured or chosen), and whether it was
  // constructed with Auto.
  ParallelMode mode() const { return options_.mode; }
  bool mode_is_auto() const { return auto_mode_ != nullptr; }
  // The chunk sizes the next step gives a batch of `batch` (device order): the split rule's; SplitRule::Auto:
  // by the devices' measured speeds (one per device, each at least one sample when there are enough).
  std::vector<int64_t> chunk_sizes(int64_t batch) const;
  // Switches between DP and DDP between steps, nothing lost: DP -> DDP copies the master's parameters,
  // buffers and optimizer state to every replica (each replica gets an optimizer from the factory given to
  // set_optimizer, loaded with the master's state); DDP -> DP keeps replica 0's, which every replica shares,
  // and its optimizer. Gradients are dropped (a switch is between steps). Not inside no_sync, not across
  // processes (backends 'mpi', 'mpi-nccl'); the same mode is a no-op.
  void set_mode(ParallelMode mode);

  nn::Module& module() { return *replicas_[0]; }  // the master (DDP: replica 0)
  nn::Module& replica(size_t i) { return *replicas_.at(i); }
  optim::Optimizer& optimizer(size_t replica = 0);
  size_t num_optimizers() const { return optimizers_.size(); }  // DP: 1, DDP: one per replica
  // DDP mode: the replicas' group; DP mode across processes (backends 'mpi', 'mpi-nccl'): the masters' (one member per
  // process); else null.
  ProcessGroup* process_group() { return group_ ? group_.get() : masters_.get(); }
  const DdpReducer* ddp_reducer() const { return ddp_reducer_.get(); }  // DDP mode; tests (engine/ddp_reducer.h)
  std::shared_ptr<nn::Module> module_ptr() { return replicas_[0]; }
  std::vector<Tensor> parameters() const { return replicas_[0]->parameters(); }
  const std::vector<Device>& device_ids() const { return device_ids_; }
  const Device& output_device() const { return output_device_; }
  const DataParallelOptions& options() const { return options_; }

  const StepReport& last_step() const { return report_; }
  // Counters for the persistence guarantees: constant after construction.
  int64_t replicas_created() const { return replicas_created_; }
  int64_t threads_created() const;
  size_t num_buckets() const;  // DP mode's gradient buckets

 private:
  friend class DataParallelGatherNode;
  friend class NoSyncGuard;
  void init(std::vector<std::shared_ptr<nn::Module>> given_replicas);
  void init_ddp();
  void verify_replica_structure() const;
  // Backend 'mpi' (across_processes.cc). Every process's model must be process 0's (names, dtypes, shapes,
  // frozen flags); `group` is the DDP replicas' or the DP masters'.
  void verify_structure_across_processes(ProcessGroup& group);
  // fn(r) for each member r of `group` on this process: the replicas' workers, or the caller for the masters.
  void run_members(ProcessGroup& group, const std::function<void(size_t)>& fn);
  // DP mode: the masters' group, checked, and process 0's master state everywhere.
  void init_dp_across_processes();
  void broadcast_master_buffers();  // before a synchronised forward
  // After a synchronised backward: the masters' gradients averaged over the processes, each weighing its
  // share of the global batch; returns the loss of every process's batch (this one's: `loss` over `batch`
  // samples).
  double average_masters(double loss, int64_t batch);
  // Over every member of every process of `group`, from member `rank`'s `loss` over `samples`: the mean loss,
  // and the number of samples.
  static double loss_over_processes(ProcessGroup& group, int rank, double loss, int64_t samples);
  static double samples_over_processes(ProcessGroup& group, int rank, int64_t samples);
  // Whether `flag` is set on any member of any process of `group` (member `rank`'s part; an all-reduce, max).
  static bool any_over_processes(ProcessGroup& group, int rank, bool flag);
  // With an enabled grad scaler (grad_scaling.cc): the tensor the step's backward starts from, and the
  // optimizer step through the scaler.
  Tensor backward_root(const Tensor& loss) const;
  void scaled_optimizer_step();
  // The mode's gradient reducer over the parameters that require grad (trainable_).
  void build_reducer();
  // Picks up requires_grad changes made after construction (Note [Frozen parameters]).
  void refresh_trainable();
  // Runs fn(r) on every replica's worker; a replica that throws aborts the process group first, so that
  // partners waiting for it in a collective fail at once instead of at the timeout.
  void run_replicas(const std::function<void(size_t)>& fn);
  // loss(output, target), checked to be one value.
  static Tensor checked_loss(const LossFn& loss, const Tensor& output, const Tensor& target);
  double forward_backward_ddp(const Tensor& input, const Tensor& target, const LossFn& loss);
  double forward_backward_once(const Tensor& input, const Tensor& target, const LossFn& loss);
  // The step's batch size along options_.dim (normalised into *dim), checked against the target's.
  int64_t step_batch(const Tensor& input, const Tensor& target, int64_t* dim) const;
  // on_device_failure (device_failure.cc): recovers from `failure` if the policy allows (returns what it
  // did) or rethrows it; `buffers` are replica 0's buffers from before the step, `accumulated` whether it
  // started with gradients (which a redo would lose). Called inside forward_backward's handler.
  std::string recover(const ReplicaError& failure, const std::vector<Tensor>& buffers, bool accumulated);
  void drop_device(size_t replica);
  // The worker pool over device_ids_: options_.timeout is also its straggler timeout (a replica still running
  // that long after another finished is lost: engine/worker_pool.h).
  std::unique_ptr<DeviceWorkerPool> make_pool() const;
  // Keeps alive for good what the pool's lost workers may still reach (their replicas and optimizers, the
  // group, the reducers): their threads are left behind (Note [Lost workers] in engine/worker_pool.cc).
  void abandon_to_lost_workers();
  // Every other place that frees or replaces one of those (a reducer rebuilt, a mode switched, optimizers
  // replaced) hands it here: dropped as usual, or kept for good once a worker of the pool was ever lost.
  void retire(std::shared_ptr<void> object);
  void connect_replicas();  // DDP: the process group over device_ids_ and the SyncBatchNorm layers' groups
  double forward_backward_deterministic(const Tensor& input, const Tensor& target, const LossFn& loss);
  void check_deterministic_options() const;
  void validate_devices();
  void check_master_placement() const;
  // The DP step's named parts (dp_mode.cc), in the order forward_args runs them.
  struct ScatteredInputs;
  using TensorSlots = detail::TensorSlots;
  int64_t check_batch(const TensorSlots& slots, int64_t* dim) const;
  std::vector<Tensor> forward_on_master(const nn::ModuleInput& input, const TensorSlots& slots, int64_t batch);
  ScatteredInputs scatter_inputs(const std::vector<Tensor>& tensors, int64_t dim, int64_t batch);
  std::vector<std::vector<Tensor>> parallel_apply(const nn::ModuleInput& input, const TensorSlots& slots,
                                                  const ScatteredInputs& scattered, size_t used);
  std::vector<Tensor> gather_outputs(std::vector<std::vector<Tensor>> outputs, const ScatteredInputs& scattered,
                                     int64_t dim);
  void sync_replicas(size_t used);  // the replicate step: one coalesced broadcast from the master
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
  std::vector<std::vector<Tensor>> replica_buffers_;  // each replica's buffers() (a subset of its state), likewise
  std::vector<std::vector<Tensor>> replica_params_;   // each replica's parameters(), frozen ones included, likewise
  std::vector<std::string> param_names_;
  std::vector<bool> trainable_;  // per parameter: requires_grad when the reducer was last built
  std::unique_ptr<DeviceWorkerPool> pool_;
  std::unique_ptr<GradientReducer> reducer_;    // DP mode
  std::shared_ptr<ProcessGroup> group_;         // DDP mode
  std::shared_ptr<ProcessGroup> masters_;       // DP mode across processes: this process's master, one per process
  std::unique_ptr<DdpReducer> ddp_reducer_;     // DDP mode
  std::vector<std::unique_ptr<optim::Optimizer>> optimizers_;
  OptimizerFactory optimizer_factory_;  // set_mode makes the replicas' optimizers with it
  std::shared_ptr<optim::GradScaler> scaler_;  // set_grad_scaler; null: no loss scaling
  bool require_backward_grad_sync_ = true;
  // ParallelMode::Auto (mode_switch.cc): each mode's measured train_step times; null without Auto.
  struct AutoModeState {
    std::vector<double> dp_ms, ddp_ms;  // after each mode's warm-up step
    bool warmed_up = false;             // the mode being measured has had its warm-up step
    std::optional<ParallelMode> chosen;
  };
  std::unique_ptr<AutoModeState> auto_mode_;
  std::unique_ptr<AutoSplit> auto_split_;  // SplitRule::Auto
  int sync_batchnorm_layers_ = 0;          // DDP mode: SyncBatchNorm layers per replica (they need samples)
  // After a step-API step: the auto split's measurement of it.
  void observe_split();
  // After a train_step of `step_ms` under Auto: records it, switches to DDP once DP is measured, and to the
  // faster mode once both are.
  void record_auto_step(double step_ms);
  int64_t replicas_created_ = 0;
  StepReport report_;
};

}  // namespace dpe
