// The engine's seam: one Step per algorithm, chosen when the engine is built or its mode switched
// (DataParallel::set_mode), driving the replicas of a ReplicaSet through the step API. A Step owns what its
// algorithm adds to the replicas (a reducer, a process group, a cross-process sync); the engine's state that
// outlives a step (the replicas, the optimizers, the split, the report) is the StepContext every step reads.
// docs/EXTENDING.md says how to add one.
//
//   DpStep (engine/dp_step.h)                 nn.DataParallel: replicate from the master, reduce into it
//   DdpStep (engine/ddp_step.h)               DistributedDataParallel: bucketed all-reduce during backward
//   ZeroStep (engine/zero_step.h)             DDP with ZeRO stage 1 or 2: optimizer state (and gradients) sharded
//   DeterministicStep (deterministic_step.h)  wraps any of them: the same bits for any device count
//
// Contract for every step: one thread (the engine's) calls its methods, never two at once; forward_backward
// and forward write ctx.report (the engine resets it first and completes it after); a method that throws
// leaves the replicas' parameters where they were (no optimizer ran), so that the failure policy
// (engine/failure_policy.h) can drop a device and redo the step.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "engine/batch_split.h"
#include "engine/options.h"
#include "engine/replica_set.h"
#include "optim/grad_scaler.h"

namespace dpe {

class DdpReducer;

// The engine's state every step reads and writes, owned by the DataParallel and outliving every step.
struct StepContext {
  DataParallelOptions options;  // as given, with device_ids and the split updated when a device is dropped
  Device output_device;
  std::unique_ptr<ReplicaSet> replicas;
  std::unique_ptr<BatchSplit> split;
  // DP: one (the master's); DDP: one per replica. Made by `make_optimizer` (set_optimizer).
  std::vector<std::unique_ptr<optim::Optimizer>> optimizers;
  OptimizerFactory make_optimizer;
  std::shared_ptr<optim::GradScaler> scaler;  // set_grad_scaler; null: no loss scaling
  bool sync = true;                           // require_backward_grad_sync: false inside no_sync()
  StepReport report;                          // what the last step did

  // The tensor a step's backward starts from: loss x scale with a grad scaler.
  Tensor backward_root(const Tensor& loss) const { return scaler ? scaler->scale(loss) : loss; }
};

// ctx.report.memory: every device's memory statistics now.
void record_memory(StepContext& ctx);

// loss(output, target), checked to be one value.
Tensor checked_loss(const LossFn& loss, const Tensor& output, const Tensor& target);

class Step {
 public:
  explicit Step(StepContext& ctx) : ctx_(ctx) {}
  virtual ~Step() = default;
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

  virtual ParallelMode mode() const = 0;
  // Replicas whose gradients and optimizer the step owns: replica 0 (DP's master) or every replica (DDP).
  virtual size_t owners() const = 0;
  // DataParallel::forward_args: the gathered outputs on the output device.
  virtual std::vector<Tensor> forward(const nn::ModuleInput& input) = 0;
  // The step API's forward, loss, backward and gradient reduction; returns the batch's loss.
  virtual double forward_backward(const Tensor& input, const Tensor& target, const LossFn& loss) = 0;
  // Every owned optimizer steps; through ctx.scaler when it is enabled (Note [One skip decision] in
  // engine/loss_scaling.h). Times itself into ctx.report.
  void optimizer_step();
  // DataParallel::zero_grad: the gradients of the replicas the step owns become undefined.
  virtual void zero_grad();
  // DataParallel::clip_grad_norm: clips the gradients the owned optimizers will step by their total 2-norm
  // (torch.nn.utils.clip_grad_norm_'s rule) and returns that norm.
  virtual double clip_grad_norm(double max_norm);
  // ctx.optimizers were (re)made from ctx.make_optimizer (set_optimizer, set_mode): a step whose replicas span
  // processes checks them against process 0's (every process calls set_optimizer at the same point); a step
  // that shards them takes them over here, keeping their state.
  virtual void optimizers_made() {}
  // DataParallel::consolidate_state_dict: a step whose optimizer state is spread over processes gathers it
  // (a collective); the others have nothing to do.
  virtual void consolidate_state_dict() {}
  // The master's requires_grad flags changed (Note [Frozen parameters]): rebuild what depends on them.
  virtual void trainable_changed() = 0;
  // Before replicas `to` (each >= 1) compute: bring them up to date with the master (DP: PyTorch's replicate,
  // one coalesced broadcast); a step whose replicas are kept identical does nothing.
  virtual TransferStats replicate(const std::vector<size_t>& /*to*/) { return {}; }
  // The failure policy dropped replica r from ctx.replicas: forget it (its group member, its optimizer).
  virtual void replica_dropped(size_t r) = 0;
  // The replicas a collective of the last failed step waited for when it timed out (empty: none timed out).
  virtual std::vector<int> missing_at_last_timeout() const { return {}; }
  // DDP: the replicas' group; DP across processes: the masters'; else null.
  virtual ProcessGroup* process_group() { return nullptr; }
  // The auto split's weights changed (DDP's all-reduce follows them).
  virtual void split_changed() {}
  // Tests and the report: DP's gradient buckets; DDP's reducer.
  virtual size_t num_buckets() const { return 0; }
  virtual const DdpReducer* ddp_reducer() const { return nullptr; }

 protected:
  // Runs each owned optimizer's step (through `scaler` when not null, combining the found-inf flags over every
  // owner) and returns whether the update was taken.
  virtual bool step_optimizers(optim::GradScaler* scaler) = 0;
  // Picks up requires_grad changes on the master before a step (Note [Frozen parameters]).
  void refresh_trainable();

  StepContext& ctx_;

  friend class DeterministicStep;  // drive the step they wrap
  friend class ZeroStep;
};

}  // namespace dpe
