// DP mode: PyTorch's nn.DataParallel over persistent replicas (docs/DATA_PARALLEL.md). One step, exactly:
//  1. The batch is split along dim by the split rule (engine/batch_split.h); chunk i goes to device_ids[i];
//     the devices with a non-empty chunk run.
//  2. replicate: the replicas that run (other than the master) get the master's parameters and buffers in one
//     coalesced broadcast. Replicas persist: they are built once, at construction.
//  3. parallel_apply: forward runs on every such device in parallel, each on its device's worker thread.
//  4. gather: the outputs are concatenated on output_device along dim, in device order.
//  5. loss.backward() reaches the gathered output's node (DataParallelGatherNode), which runs every replica's
//     backward in parallel on the workers; gradients are summed into the master's .grad bucket by bucket as
//     soon as a bucket is ready on every replica (Note [DP reduction overlap] in engine/dp_reducer.h).
// Replica 0 is the master module itself, so its buffer updates (BatchNorm running stats) persist, like
// PyTorch; BufferPolicy::Average averages the running replicas' floating-point buffers into the master
// instead. With one device nothing is broadcast or reduced: forward is the module's own, bit for bit.
// Across processes (backend 'mpi' or 'mpi-nccl') the step API also averages the masters' gradients over the
// processes (MastersSync, engine/across_processes.h). One optimizer: the master's.
#pragma once

#include <memory>
#include <vector>

#include "engine/step.h"

namespace dpe {

class DpReducer;
class MastersSync;

class DpStep final : public Step {
 public:
  explicit DpStep(StepContext& ctx);
  ~DpStep() override;

  ParallelMode mode() const override { return ParallelMode::DP; }
  size_t owners() const override { return 1; }
  std::vector<Tensor> forward(const nn::ModuleInput& input) override;
  double forward_backward(const Tensor& input, const Tensor& target, const LossFn& loss) override;
  void trainable_changed() override;
  TransferStats replicate(const std::vector<size_t>& to) override;
  void replica_dropped(size_t r) override;
  std::vector<int> missing_at_last_timeout() const override;
  ProcessGroup* process_group() override;
  void optimizers_made() override;
  size_t num_buckets() const override;

  // The gather node's backward: replica ran[k] backpropagates roots[k] with root_grads[k] on its worker while
  // the reducer sums the gradients into the master; `used` workers take part (ran.back() + 1).
  void backward(const std::vector<std::vector<Tensor>>& roots, const std::vector<std::vector<Tensor>>& root_grads,
                const std::vector<size_t>& ran);

 private:
  bool step_optimizers(optim::GradScaler* scaler) override;
  void build_reducer();

  std::unique_ptr<DpReducer> reducer_;   // several devices
  std::unique_ptr<MastersSync> masters_;  // across processes
};

// DataParallel.forward's parts (scatter, replicate, parallel_apply, gather) over ctx's replicas, returning
// the gathered outputs. `dp` not null: DP mode (the replicas are brought up to date with the master first, and
// a recorded graph gets a gather node whose backward runs dp->backward); null: DDP mode's evaluation forward
// (its replicas are kept identical by their optimizers; no graph is recorded).
std::vector<Tensor> parallel_forward(StepContext& ctx, const nn::ModuleInput& input, DpStep* dp);

}  // namespace dpe
