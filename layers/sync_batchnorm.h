// SyncBatchNorm: PyTorch's nn.SyncBatchNorm for DDP mode — batch statistics over the union of every
// member's batch — and convert_sync_batchnorm.
//
// The module is a BatchNorm (layers/batchnorm.h): same options, parameters, buffers and state_dict keys;
// input (N, C, *) of any rank >= 2. It synchronises only when training with a process group of size > 1
// (set_process_group); otherwise — no group, a group of one, eval — it is exactly BatchNorm (same op, same
// bits, no collective).
//
// Synchronised training, per channel, on member r's own thread (docs/PYTORCH_SEMANTICS.md §3):
//   forward:  local mean_r, invstd_r = 1/sqrt(var_biased_r + eps), n_r = numel / C;
//             ONE all_gather_into_tensor of [mean (C), invstd (C), n_r (1)] (x's dtype, x's device);
//             pairwise (Chan) merge in rank order, members with n_j = 0 skipped, giving mean, invstd and
//             N = sum n_j; y = (x - mean) * invstd * weight + bias; running stats updated with the merged
//             mean and the unbiased var_n / (N - 1); num_batches_tracked += 1.
//   backward: local sum_dy, sum_dy_xmu; grad_weight = sum_dy_xmu * invstd and grad_bias = sum_dy are LOCAL
//             (DDP all-reduces parameter gradients); when x needs a gradient, ONE all_reduce (Sum) of
//             [sum_dy, sum_dy_xmu] (2C), then dx = (dy - sum_dy/N - (x - mean) * invstd^2 * sum_dy_xmu/N)
//             * invstd * weight.
// So every member must run the same SyncBatchNorm layers in the same order, forward and backward (the
// collectives' contract, collectives/process_group.h); a member with an empty batch (N_r = 0) still
// takes part. See Note [SyncBatchNorm merge on the host] in the .cc for where the merge runs.
#pragma once

#include <memory>

#include "layers/batchnorm.h"
#include "collectives/process_group.h"

namespace dpe::nn {

// x: (N, C, *) with any rank >= 2
class SyncBatchNorm : public BatchNormBase<SyncBatchNorm> {
 public:
  explicit SyncBatchNorm(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true,
                         bool track_running_stats = true);
  // The copy (used by clone()) has no process group: a replica is a different member, and the engine gives
  // each replica its own rank with set_process_group.
  SyncBatchNorm(const SyncBatchNorm& other);

  // The group this module synchronises over and its member index `rank` in it (0 <= rank < size()); a null
  // group detaches the module (it then behaves like BatchNorm).
  void set_process_group(std::shared_ptr<ProcessGroup> group, int rank);
  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }
  int rank() const { return rank_; }

  // x: (N, C, *)  ->  x's shape
  Tensor forward(const Tensor& x) override;

  // A SyncBatchNorm with bn's options and training mode that holds bn's own parameter and buffer tensors
  // (the same handles, like PyTorch's converter: an optimizer built on bn's parameters keeps working).
  static std::shared_ptr<SyncBatchNorm> from_batchnorm(const BatchNorm1d& bn);
  static std::shared_ptr<SyncBatchNorm> from_batchnorm(const BatchNorm2d& bn);

 protected:
  void check_input_dim(const Tensor& x) const override;

 private:
  template <typename BN>
  static std::shared_ptr<SyncBatchNorm> adopt(const BN& bn);
  // The training forward with a group of size > 1.
  Tensor forward_sync(const Tensor& x);

  std::shared_ptr<ProcessGroup> group_;
  int rank_ = 0;
};

extern template class BatchNormBase<SyncBatchNorm>;

// PyTorch's SyncBatchNorm.convert_sync_batchnorm: returns `module` with every BatchNorm1d/BatchNorm2d in it
// replaced by SyncBatchNorm::from_batchnorm (same options, the same parameter and buffer tensors, same
// device and mode). The root itself may be a BatchNorm (a new module is returned); otherwise the root is
// changed in place (Module::replace_module) and returned.
//
// Limitation: every module on the path from the root to a BatchNorm must be a container (Sequential,
// ModuleList, ModuleDict). A custom module holds its children in typed members (`std::shared_ptr<BatchNorm2d>
// bn`) that cannot be retargeted to another type, and its clone() rebuilds them with reset(), so a converted
// model would silently keep (or, in DataParallel replicas, get back) plain BatchNorm. Such a path is an
// error naming it, thrown before anything is changed; build those models with SyncBatchNorm directly
// (e.g. a norm-layer factory argument, like torchvision's ResNet).
std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> module);

// Calls set_process_group(group, rank) on every SyncBatchNorm in `module` (itself included); returns how
// many it found. The engine calls it on each replica with that replica's rank.
int set_sync_batchnorm_group(Module& module, const std::shared_ptr<ProcessGroup>& group, int rank);

}  // namespace dpe::nn
