// DataParallel: PyTorch's nn.DataParallel semantics with persistent replicas and worker threads, and
// DistributedDataParallel's algorithm one switch away (DataParallelOptions::mode; docs/DATA_PARALLEL.md).
//
//   auto model = std::make_shared<Mlp>();                         // on cpu:0 / cuda:0
//   DataParallel dp(model, {.device_ids = {Device::cpu(0), Device::cpu(1)}});
//   Tensor out = dp.forward(x);                                   // scatter, replicate, forward, gather
//   Tensor loss = cross_entropy(out, target);
//   loss.backward();                                              // replicas' backward + reduction
//   optimizer.step();                                             // on the master's parameters
//
// The engine is a front over a ReplicaSet (the devices, their replicas and worker threads:
// engine/replica_set.h) and one Step per mode (engine/step.h): DpStep (engine/dp_step.h says what one DP step
// does, exactly), DdpStep (engine/ddp_step.h), DeterministicStep around either. Frozen parameters: Note
// [Frozen parameters] in engine/replica_set.h. Thread-safety: one thread drives a DataParallel at a time.
#pragma once

#include <memory>
#include <vector>

#include "engine/options.h"
#include "engine/replica_error.h"
#include "layers/module.h"

namespace dpe {

class DataParallel;
class DdpReducer;
class Step;
struct StepContext;
class AutoMode;
namespace optim {
class GradScaler;  // optim/grad_scaler.h; include it to make one
}  // namespace optim

// DDP's no_sync(): while alive, backward passes accumulate gradients locally without any collective; the
// next synchronised backward reduces the accumulated gradients. In DP mode gradients always land in the
// master, and the deterministic mode sums its shards in every backward, so the guard changes nothing there.
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
  // DDP mode: evaluation only (gradients disabled); training goes through forward_backward.
  Tensor forward(const Tensor& input);
  // Structured form: every tensor argument (positional or named) is split along dim (they must agree on
  // the size there), every other value goes unchanged to each replica that runs; the module's forward_args
  // runs on each and each of its outputs is gathered on output_device (0-dim outputs become a vector of one
  // value per replica, with a one-time warning, like PyTorch). With no tensor argument, the module runs
  // once, on device_ids[0].
  std::vector<Tensor> forward_args(const nn::ModuleInput& input);

  // ---- The step API, identical in both modes (so DP and DDP are compared on exactly the same work) ----
  // Splits input and target along dim, runs forward, the loss, backward and the gradient reduction. DP: the
  // loss of the gathered output on output_device, gradients reduced into the master. DDP: each replica's
  // loss on its own shard, gradients averaged over replicas, each weighted by its shard's share of the
  // global batch (so uneven shards give the full-batch mean, as DP; PyTorch's DDP would average the replicas'
  // means). Gradients accumulate (call zero_grad between steps). Returns the batch loss (DDP: the shards'
  // losses weighted by shard size; across processes, backends 'mpi' and 'mpi-nccl': over every process's
  // batch, outside no_sync, so that every process returns the same). LossFn: layers/loss.h.
  double forward_backward(const Tensor& input, const Tensor& target, const LossFn& loss);
  // Across processes every process calls it at the same point: the optimizers are checked against process 0's
  // (type, param groups, hyper-parameters) and a difference throws on every process, naming it.
  void set_optimizer(const OptimizerFactory& make);
  void optimizer_step();  // DP: the master's optimizer; DDP: every replica's, in parallel on the workers
  void zero_grad();       // gradients of the replicas the mode owns become undefined (ZeRO: their shards too)
  // torch.nn.utils.clip_grad_norm_ over the gradients the optimizers will step, between forward_backward and
  // optimizer_step (after GradScaler::unscale_ of every optimizer when loss scaling): DP the master's, DDP every
  // replica's (all the same), ZeRO each replica's pieces by the norm over all of them (FSDP's clip_grad_norm_; the
  // replicas' .grad outside their pieces are left as they are).
  // Returns the total 2-norm before clipping.
  double clip_grad_norm(double max_norm);
  // zero_grad + forward_backward + optimizer_step. Not inside no_sync.
  double train_step(const Tensor& input, const Tensor& target, const LossFn& loss);
  // Dynamic loss scaling for the step API (PyTorch's GradScaler recipe; null: none, the default). While set,
  // forward_backward backpropagates scaler.scale(loss) (the loss it returns stays unscaled) and
  // optimizer_step unscales the gradients, skips the update when one holds an inf or NaN, and calls
  // scaler.update() once; in DDP mode every replica steps or none does (Note [One skip decision] in
  // engine/loss_scaling.h). StepReport says loss_scale and skipped_step. To clip gradients, call
  // scaler.unscale_(optimizer(r)) for every optimizer between forward_backward and optimizer_step (PyTorch's
  // recipe). forward() plus a hand-written backward do not use it: call scaler.scale(loss).backward(),
  // scaler.step(dp.optimizer()) and scaler.update() there, as with one device. A scaler drives one engine at
  // a time.
  void set_grad_scaler(std::shared_ptr<optim::GradScaler> scaler);
  optim::GradScaler* grad_scaler() const;
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  bool require_backward_grad_sync() const;

  // The mode steps run in now (DP or DDP; with Auto, the one being measured or chosen), and whether it was
  // constructed with Auto.
  ParallelMode mode() const;
  bool mode_is_auto() const { return auto_mode_ != nullptr; }
  // The chunk sizes the next step gives a batch of `batch`, per device in device order up to the last one
  // with a sample (a device whose share is zero keeps its place with 0; engine/batch_split.h).
  std::vector<int64_t> chunk_sizes(int64_t batch) const;
  // Switches between DP and DDP between steps, nothing lost: DP -> DDP copies the master's parameters,
  // buffers and optimizer state to every replica (each replica gets an optimizer from the factory given to
  // set_optimizer, loaded with the master's state); DDP -> DP keeps replica 0's, which every replica shares,
  // and its optimizer. Gradients are dropped (a switch is between steps). Not inside no_sync, not across
  // processes (backends 'mpi', 'mpi-nccl'); the same mode is a no-op.
  void set_mode(ParallelMode mode);

  nn::Module& module() { return replica(0); }  // the master (DDP: replica 0)
  nn::Module& replica(size_t i);
  std::shared_ptr<nn::Module> module_ptr();
  std::vector<Tensor> parameters() const;
  optim::Optimizer& optimizer(size_t replica = 0);
  // ZeRO across processes (zero_stage > 0, backend 'mpi' or 'mpi-nccl'): gathers the whole optimizer state from
  // every process's devices so that optimizer(r).state_dict() returns it (for a checkpoint) until the next step;
  // every process calls it at the same point (PyTorch's ZeroRedundancyOptimizer.consolidate_state_dict).
  // Anywhere else state_dict() is whole already and this does nothing.
  void consolidate_state_dict();
  size_t num_optimizers() const;  // DP: 1, DDP: one per replica
  // DDP mode: the replicas' group; DP mode across processes: the masters' (one member per process); else null.
  ProcessGroup* process_group();
  const DdpReducer* ddp_reducer() const;  // DDP mode; tests (engine/ddp_reducer.h)
  const std::vector<Device>& device_ids() const;
  const Device& output_device() const;
  const DataParallelOptions& options() const;

  const StepReport& last_step() const;
  // Counters for the persistence guarantees: constant after construction.
  int64_t replicas_created() const;
  int64_t threads_created() const;
  size_t num_buckets() const;  // DP mode's gradient buckets

 private:
  friend class NoSyncGuard;
  void init(std::vector<std::shared_ptr<nn::Module>> given);
  std::unique_ptr<Step> make_step(ParallelMode mode);
  double forward_backward_once(const Tensor& input, const Tensor& target, const LossFn& loss);

  std::unique_ptr<StepContext> ctx_;  // before step_, which refers to it
  std::unique_ptr<Step> step_;
  std::unique_ptr<AutoMode> auto_mode_;  // ParallelMode::Auto; null otherwise
};

}  // namespace dpe
