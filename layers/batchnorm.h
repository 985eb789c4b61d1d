// BatchNorm1d / BatchNorm2d: PyTorch's nn.BatchNorm1d/2d over core/ops/norm.h batch_norm.
//
// Parameters weight (C) = 1 and bias (C) = 0 (when affine); buffers running_mean (C) = 0, running_var (C) = 1
// and num_batches_tracked (int64 scalar) = 0 (when track_running_stats), registered in PyTorch's order so
// state_dict keys match. Training: batch statistics, running stats updated in place (momentum, unbiased
// variance), num_batches_tracked += 1. Eval: running stats (batch statistics when not tracked).
// Under DataParallel each replica updates its own buffers (PyTorch semantics: DP keeps replica 0's, DDP
// broadcasts rank 0's at the next forward). SyncBatchNorm (layers/sync_batchnorm.h) shares this base.
#pragma once

#include <string>

#include "layers/module.h"

namespace dpe::nn {

struct BatchNormOptions {
  int64_t num_features = 0;
  double eps = 1e-5;
  double momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
};

// The shared implementation; Derived only says which input ranks it accepts.
template <typename Derived>
class BatchNormBase : public Cloneable<Derived> {
 public:
  BatchNormBase(std::string type_name, BatchNormOptions options);

  void reset() override;
  // x: (N, C, *) with a rank Derived accepts  ->  x's shape
  Tensor forward(const Tensor& x) override;

  const BatchNormOptions& options() const { return options_; }
  Tensor weight;               // (C) or undefined (affine = false)
  Tensor bias;                 // (C) or undefined
  Tensor running_mean;         // (C) or undefined (track_running_stats = false)
  Tensor running_var;          // (C) or undefined
  Tensor num_batches_tracked;  // int64 0-dim or undefined

 protected:
  // Throws naming the module and the shape unless x has an accepted rank.
  virtual void check_input_dim(const Tensor& x) const = 0;
  // Throws naming the module and the shape unless x is defined, has an accepted rank and num_features
  // channels at dim 1.
  void check_input(const Tensor& x) const;
  // num_batches_tracked += 1 when training with tracked stats (no-op otherwise), for forwards that do not hand
  // the counter to batch_norm (SyncBatchNorm's).
  void count_batch();

 private:
  BatchNormOptions options_;
};

// x: (N, C) or (N, C, L)
class BatchNorm1d : public BatchNormBase<BatchNorm1d> {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true,
                       bool track_running_stats = true);

 protected:
  void check_input_dim(const Tensor& x) const override;
};

// x: (N, C, H, W)
class BatchNorm2d : public BatchNormBase<BatchNorm2d> {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true,
                       bool track_running_stats = true);

 protected:
  void check_input_dim(const Tensor& x) const override;
};

extern template class BatchNormBase<BatchNorm1d>;
extern template class BatchNormBase<BatchNorm2d>;

}  // namespace dpe::nn
