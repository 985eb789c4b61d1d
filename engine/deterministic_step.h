// DeterministicStep (DataParallelOptions::deterministic): the same bits whatever the device count and
// whichever mode, because nothing a device computes depends on which device it is or how many there are.
//
//  1. The batch is cut into K virtual shards by the balanced rule (K = virtual_shards), the same cut for any
//     device count; the devices take contiguous runs of shards (balanced over the devices).
//  2. Each shard runs alone on its device's replica, whose parameters are the master's (DP: copied from it;
//     DDP: kept identical) and whose buffers are reset to the step's starting buffers S: forward, the loss
//     (the shard's mean) times n_k / N, backward into gradients that start undefined, so that each shard's
//     gradient is its own, computed by the same kernels on the same shapes with one intra-op thread (the
//     pool's workers run with one in this mode) wherever it runs.
//  3. The shards' gradients are summed in a fixed binary tree by shard index (engine/shard_tree.h): on CPU
//     devices each device sums a slice of every parameter straight from the shards' gradients (Note [The
//     shards' sum in host memory]); elsewhere each device sums the tree's nodes whose shards it ran and the
//     rest of the tree joins those on device_ids[0]. Their buffers (BatchNorm's running statistics after the
//     shard's forward from S) are averaged in the same tree: statistics are per virtual shard, and the step's
//     update is the mean of the shards' (integer buffers take shard 0's).
//  4. DP: the master's .grad gets the sum (accumulating onto a defined one) and its buffers the mean; DDP:
//     every replica's. The optimizers then do the same arithmetic in either mode. Inside no_sync too: the
//     sum is per backward, so accumulated steps end with the same gradients a synchronised backward would
//     give, and no replica's .grad is ever only its own.
// CUDA devices: the same, as far as the kernels are deterministic (docs/DATA_PARALLEL.md lists them): cuDNN's
// convolutions run deterministic algorithms (conv_cuda.cu; a step refuses CUDA devices while
// backends::cudnn::benchmark is on: it may choose others, per device), cuBLAS repeats its bits on one stream
// per device, dpe's reductions use fixed trees; index_add (Embedding's backward) uses atomics and is not.
// It wraps the mode's own step (DpStep, DdpStep or ZeroStep), which keeps everything but forward_backward: forward,
// the optimizers, the reducer rebuilt on frozen parameters, the device dropped.
#pragma once

#include <memory>
#include <vector>

#include "engine/step.h"

namespace dpe {

class DeterministicStep final : public Step {
 public:
  // mode: the step of the engine's mode (DP or DDP), which this one drives.
  DeterministicStep(StepContext& ctx, std::unique_ptr<Step> mode);

  ParallelMode mode() const override { return mode_->mode(); }
  size_t owners() const override { return mode_->owners(); }
  std::vector<Tensor> forward(const nn::ModuleInput& input) override { return mode_->forward(input); }
  double forward_backward(const Tensor& input, const Tensor& target, const LossFn& loss) override;
  void trainable_changed() override { mode_->trainable_changed(); }
  void zero_grad() override { mode_->zero_grad(); }
  double clip_grad_norm(double max_norm) override { return mode_->clip_grad_norm(max_norm); }
  void optimizers_made() override { mode_->optimizers_made(); }
  void consolidate_state_dict() override { mode_->consolidate_state_dict(); }
  TransferStats replicate(const std::vector<size_t>& to) override { return mode_->replicate(to); }
  void replica_dropped(size_t r) override { mode_->replica_dropped(r); }
  std::vector<int> missing_at_last_timeout() const override { return mode_->missing_at_last_timeout(); }
  ProcessGroup* process_group() override { return mode_->process_group(); }
  void split_changed() override { mode_->split_changed(); }
  size_t num_buckets() const override { return mode_->num_buckets(); }
  const DdpReducer* ddp_reducer() const override { return mode_->ddp_reducer(); }

 private:
  struct Plan;  // one step's virtual shards, where they run, and what they produced (deterministic_step.cc)
  bool step_optimizers(optim::GradScaler* scaler) override { return mode_->step_optimizers(scaler); }
  Plan plan_shards(const Tensor& input, const Tensor& target);
  void run_shards(Plan& plan, const Tensor& input, const Tensor& target, const LossFn& loss);
  // Per owner of a .grad (DP: the master; DDP: every replica), the tree's root of each trainable parameter.
  std::vector<std::vector<Tensor>> sum_on_host(const Plan& plan);
  std::vector<std::vector<Tensor>> sum_on_devices(const Plan& plan);
  void average_buffers(const Plan& plan);

  std::unique_ptr<Step> mode_;
};

}  // namespace dpe
