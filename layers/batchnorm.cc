#include "layers/batchnorm.h"

#include "core/error.h"
#include "core/ops.h"
#include "core/ops/norm.h"
#include "layers/sync_batchnorm.h"

namespace dpe::nn {

template <typename Derived>
BatchNormBase<Derived>::BatchNormBase(std::string type_name, BatchNormOptions options)
    : Cloneable<Derived>(std::move(type_name)), options_(options) {
  DPE_CHECK(options_.num_features > 0, this->type_name(), "(", options_.num_features,
            "): num_features must be positive");
  DPE_CHECK(options_.eps >= 0, this->type_name(), ": eps ", options_.eps, " is negative");
  reset();
}

template <typename Derived>
void BatchNormBase<Derived>::reset() {
  const int64_t c = options_.num_features;
  weight = bias = running_mean = running_var = num_batches_tracked = Tensor();
  if (options_.affine) {
    weight = this->register_parameter("weight", ones({c}));
    bias = this->register_parameter("bias", zeros({c}));
  }
  if (options_.track_running_stats) {
    running_mean = this->register_buffer("running_mean", zeros({c}));
    running_var = this->register_buffer("running_var", ones({c}));
    num_batches_tracked = this->register_buffer("num_batches_tracked", zeros({}, TensorOptions(DType::Int64)));
  }
}

template <typename Derived>
void BatchNormBase<Derived>::check_input(const Tensor& x) const {
  DPE_CHECK(x.defined(), this->type_name(), ": undefined input");
  check_input_dim(x);
  DPE_CHECK(x.size(1) == options_.num_features, this->type_name(), "(", options_.num_features, "): expected ",
            options_.num_features, " channels at dim 1, got input ", shape_str(x.shape()));
}

template <typename Derived>
void BatchNormBase<Derived>::count_batch() {
  if (this->is_training() && options_.track_running_stats) increment_batch_count(num_batches_tracked);
}

// x: (N, C, *)  ->  x's shape
template <typename Derived>
Tensor BatchNormBase<Derived>::forward(const Tensor& x) {
  check_input(x);
  // The op counts the batch in its statistics pass (no launches of its own on a GPU).
  const bool counting = this->is_training() && options_.track_running_stats;
  return batch_norm(x, running_mean, running_var, weight, bias, this->is_training(), options_.momentum,
                    options_.eps, counting ? num_batches_tracked : Tensor());
}

template class BatchNormBase<BatchNorm1d>;
template class BatchNormBase<BatchNorm2d>;
template class BatchNormBase<SyncBatchNorm>;  // layers/sync_batchnorm.h

BatchNorm1d::BatchNorm1d(int64_t num_features, double eps, double momentum, bool affine, bool track_running_stats)
    : BatchNormBase("BatchNorm1d", BatchNormOptions{num_features, eps, momentum, affine, track_running_stats}) {}

void BatchNorm1d::check_input_dim(const Tensor& x) const {
  DPE_CHECK(x.dim() == 2 || x.dim() == 3, "BatchNorm1d: expected 2D or 3D input (N, C) or (N, C, L), got ",
            x.dim(), "D input ", shape_str(x.shape()));
}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, double momentum, bool affine, bool track_running_stats)
    : BatchNormBase("BatchNorm2d", BatchNormOptions{num_features, eps, momentum, affine, track_running_stats}) {}

void BatchNorm2d::check_input_dim(const Tensor& x) const {
  DPE_CHECK(x.dim() == 4, "BatchNorm2d: expected 4D input (N, C, H, W), got ", x.dim(), "D input ",
            shape_str(x.shape()));
}

}  // namespace dpe::nn
