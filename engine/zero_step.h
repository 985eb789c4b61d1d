// ZeroStep (DataParallelOptions::zero_stage 1 or 2): DDP whose optimizer state (stage 1) and gradients (stage
// 2) are sharded over the replicas, ZeRO's first two stages (DeepSpeed; PyTorch's ZeroRedundancyOptimizer for
// stage 1; llm.c's ZeRO-1). docs/DATA_PARALLEL.md "Memory: ZeRO" has the memory per device of each stage.
// Each replica owns one shard of every gradient bucket (engine/zero_layout.h: balanced to an element); its
// optimizer (engine/zero_optimizer.h) keeps state for those elements only. One step:
//  1. forward_backward is DDP's (engine/ddp_step.h), buckets fixed at construction. Stage 1: each bucket is
//     all-reduced as in DDP. Stage 2: each bucket is reduce-scattered as soon as it is complete, while
//     backward goes on; a replica keeps the reduced shard it owns and frees the bucket's gradients.
//  2. Each owned piece's .grad becomes its slice of the reduced gradient, so that clipping (clip_grad_norm:
//     the norm over every replica's pieces) and GradScaler::unscale_ see what will be stepped.
//  3. optimizer_step: every replica steps its pieces (the same elementwise update as DDP's, so the result is
//     DDP's bit for bit), then every bucket's parameters are all-gathered from their owners.
// The failure policy's dropped device, frozen parameters that change, and set_optimizer re-partition: the
// whole optimizer state is gathered, the layout recomputed for the replicas left, and the state cut again.
// Across processes (backend 'mpi', 'mpi-nccl') the layout spans every process's devices (rank k: global rank
// k), the collectives are the backend's reduce-scatter and all-gather, and the whole state is gathered by a
// collective (consolidate_state_dict).
#pragma once

#include <memory>
#include <vector>

#include "engine/ddp_step.h"

namespace dpe {

class ZeroOptimizer;

class ZeroStep final : public Step {
 public:
  explicit ZeroStep(StepContext& ctx);
  ~ZeroStep() override;

  ParallelMode mode() const override { return ParallelMode::DDP; }
  size_t owners() const override { return ddp_->owners(); }
  std::vector<Tensor> forward(const nn::ModuleInput& input) override { return ddp_->forward(input); }
  double forward_backward(const Tensor& input, const Tensor& target, const LossFn& loss) override;
  void trainable_changed() override;
  void replica_dropped(size_t r) override;
  std::vector<int> missing_at_last_timeout() const override { return ddp_->missing_at_last_timeout(); }
  ProcessGroup* process_group() override { return ddp_->process_group(); }
  void split_changed() override { ddp_->split_changed(); }
  const DdpReducer* ddp_reducer() const override { return ddp_->ddp_reducer(); }
  void zero_grad() override;
  double clip_grad_norm(double max_norm) override;
  void optimizers_made() override;
  void consolidate_state_dict() override;

 private:
  bool step_optimizers(optim::GradScaler* scaler) override;
  // Re-partitions around `change` (which may rebuild the reducer or drop a replica): the whole state is
  // gathered before it and cut again after.
  template <typename Change>
  void repartition(const Change& change);
  bool across_processes() const;
  // The whole optimizer state, assembled on every process from every process's pieces (a collective).
  optim::OptimizerStateDict gather_state_across_processes();
  ZeroOptimizer& optimizer(size_t r);
  void attach_gradients(size_t r);
  void all_gather_parameters(size_t r);
  size_t rank(size_t r) const;

  std::unique_ptr<DdpStep> ddp_;
  std::vector<std::vector<Tensor>> params_;  // per replica: the reducer's parameters
};

}  // namespace dpe
