// DDP mode: DistributedDataParallel's algorithm over the engine's worker threads (docs/DATA_PARALLEL.md;
// engine/ddp_reducer.h has the reduction's rules). Construction: the replicas' structure is checked (and across
// processes, every process's against process 0's), replica 0's parameters and buffers are broadcast to every
// replica (PyTorch's _sync_module_states), and the replicas' SyncBatchNorm layers join the group.
// One step (forward_backward):
//  1. Input and target are split by the engine's split; a device without a sample runs no forward or
//     backward but contributes zeros (weight 0) to every all-reduce, so PyTorch's uneven-inputs problem does
//     not arise (not with SyncBatchNorm, which needs a sample on every replica).
//  2. On every worker at once: replica 0's buffers are broadcast (broadcast_buffers), the replica runs
//     forward and the loss on its own shard, then backward; each gradient is weighted by its shard's share of
//     the batch and all-reduced in buckets as soon as a bucket is complete, while backward goes on.
//  3. optimizer_step runs every replica's own optimizer on its worker; replicas stay bit-identical because
//     they start identical and see identical averaged gradients.
#pragma once

#include <memory>
#include <vector>

#include "engine/step.h"

namespace dpe {

class DdpStep final : public Step {
 public:
  explicit DdpStep(StepContext& ctx);
  ~DdpStep() override;

  ParallelMode mode() const override { return ParallelMode::DDP; }
  size_t owners() const override { return ctx_.replicas->size(); }
  // Evaluation only (gradients disabled): training goes through forward_backward, where every replica
  // computes its own loss.
  std::vector<Tensor> forward(const nn::ModuleInput& input) override;
  double forward_backward(const Tensor& input, const Tensor& target, const LossFn& loss) override;
  void trainable_changed() override;
  void replica_dropped(size_t r) override;
  std::vector<int> missing_at_last_timeout() const override { return group_->missing_at_last_timeout(); }
  ProcessGroup* process_group() override { return group_.get(); }
  void split_changed() override;
  const DdpReducer* ddp_reducer() const override { return reducer_.get(); }
  void optimizers_made() override;
  DdpReducer& reducer() { return *reducer_; }  // ZeroStep's

 private:
  struct Shards;     // one step's shards and what each replica measured (ddp_step.cc)
  bool step_optimizers(optim::GradScaler* scaler) override;
  void connect_replicas();
  void build_reducer();
  Shards shard(const Tensor& input, const Tensor& target);
  void broadcast_buffers(size_t r, Shards& shards);
  void replica_task(size_t r, Shards& shards, const LossFn& loss);
  double fold_report(const Shards& shards, int64_t allreduces_before);

  std::shared_ptr<ProcessGroup> group_;  // one member per replica (of every process, across processes)
  std::unique_ptr<DdpReducer> reducer_;
  int sync_batchnorm_layers_ = 0;  // per replica: they need a sample on every replica
};

}  // namespace dpe
