// SyncBatchNorm and convert_sync_batchnorm (see layers/sync_batchnorm.h).
#include "layers/sync_batchnorm.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/autograd/function.h"
#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"
#include "layers/containers.h"

namespace dpe::nn {

// Note [SyncBatchNorm merge on the host]
// The gathered statistics are W * (2C + 1) numbers. They are read back to the host and merged there in
// float64 (Chan's pairwise update, members in rank order, empty members skipped), then the merged mean and
// invstd (C each) are copied to the member's device. On CUDA that is one stream synchronisation per layer
// and forward; PyTorch pays the same (it filters the empty members with a boolean mask, whose size must be
// read back). The host merge also gives every member bit-identical merged statistics (the same numbers, the
// same order, the same arithmetic) and the total count N needed by the backward, without another read.

SyncBatchNorm::SyncBatchNorm(int64_t num_features, double eps, double momentum, bool affine,
                             bool track_running_stats)
    : BatchNormBase("SyncBatchNorm", BatchNormOptions{num_features, eps, momentum, affine, track_running_stats}) {}

SyncBatchNorm::SyncBatchNorm(const SyncBatchNorm& other) : BatchNormBase(other) {}

void SyncBatchNorm::check_input_dim(const Tensor& x) const {
  DPE_CHECK(x.dim() >= 2, "SyncBatchNorm: expected at least 2D input (N, C, *), got ", x.dim(), "D input ",
            shape_str(x.shape()));
}

void SyncBatchNorm::set_process_group(std::shared_ptr<ProcessGroup> group, int rank) {
  if (group != nullptr) {
    DPE_CHECK(rank >= 0 && rank < group->size(), "SyncBatchNorm(", options().num_features,
              ").set_process_group: rank ", rank, " is out of range for a group of ", group->size(), " members");
  }
  rank_ = group != nullptr ? rank : 0;
  group_ = std::move(group);
}

// x: (N, C, *)  ->  x's shape
Tensor SyncBatchNorm::forward(const Tensor& x) {
  if (!is_training() || group_ == nullptr || group_->world_size() == 1) return BatchNormBase::forward(x);
  return forward_sync(x);
}

// x: (N, C, *) viewed as (N, C, S)  stats: (C)  ->  x's shape
Tensor SyncBatchNorm::forward_sync(const Tensor& x) {
  const BatchNormOptions& o = options();
  const int64_t C = o.num_features;
  const int W = group_->world_size();  // every member of every process the group spans
  // Errors only this member can see: abort the group, so that the other members are not left waiting in
  // the all_gather for a member that will never come, then throw.
  try {
    check_input(x);
    DPE_CHECK(is_compute_type(x.dtype()), type_name(), ": expected a float32 or float64 input, got ", x.dtype());
    for (auto [t, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"},
                           std::pair{&running_mean, "running_mean"}, std::pair{&running_var, "running_var"}}) {
      DPE_CHECK(!t->defined() || (t->device() == x.device() && t->dtype() == x.dtype()), type_name(), ": ", name,
                " is ", t->dtype(), " on ", t->device(), " but the input is ", x.dtype(), " on ", x.device());
    }
  } catch (const Error& e) {
    group_->abort(detail::str_cat_or_empty("SyncBatchNorm on member ", rank_, " failed: ", e.what()));
    throw;
  }

  const int64_t N = x.size(0);
  int64_t S = 1;
  for (int64_t d = 2; d < x.dim(); ++d) S *= x.size(d);
  const int64_t n_local = N * S;  // values per channel on this member
  const Shape param_shape{1, C, 1};
  const TensorOptions topt = TensorOptions(x.dtype()).with_device(x.device());
  Tensor x3 = x.detach().reshape({N, C, S});

  Tensor y, mean_t, invstd_t;
  double total = 0;  // N over the group
  {
    NoGradGuard no_grad;
    // 1. Local statistics (zeros with count 0 for an empty batch: skipped by the merge).
    Tensor local_mean = zeros({C}, topt), local_invstd = zeros({C}, topt);
    if (n_local > 0) {
      const double inv_n = 1.0 / static_cast<double>(n_local);
      local_mean = mul(sum(x3, {0, 2}), inv_n);
      Tensor var = mul(sum(square(sub(x3, local_mean.view(param_shape))), {0, 2}), inv_n);  // biased
      local_invstd = rsqrt(add(var, o.eps));
    }
    Tensor local = cat({local_mean, local_invstd, full({1}, static_cast<double>(n_local), topt)});  // (2C + 1)

    // 2. One all_gather: member j's statistics at [j * (2C + 1), (j + 1) * (2C + 1)).
    Tensor gathered = zeros({W * (2 * C + 1)}, topt);
    group_->all_gather_into_tensor(rank_, gathered, local);

    // 3. Merge (Note [SyncBatchNorm merge on the host]); every member computes the same numbers.
    const std::vector<double> all = gathered.to_vector<double>();
    const size_t stride = static_cast<size_t>(2 * C + 1);
    for (int j = 0; j < W; ++j) {
      const double n_j = all[j * stride + 2 * C];
      if (n_j >= 1) total += n_j;
    }
    DPE_CHECK(total > 1, type_name(), ": expected more than 1 value per channel when training, got ", total,
              " over the group's ", W, " members (this member's input ", shape_str(x.shape()), ")");
    std::vector<double> mean(C), invstd(C), var_unbiased(C);
    for (int64_t c = 0; c < C; ++c) {
      double n = 0, avg = 0, var_n = 0;  // var_n: sum of squared deviations so far
      for (int j = 0; j < W; ++j) {
        const double* member = &all[j * stride];
        const double n_j = member[2 * C];
        if (n_j < 1) continue;
        const double m_j = member[c];
        const double std_j = 1.0 / member[C + c];
        const double var_j = std_j * std_j - o.eps;  // biased variance of member j
        const double delta = avg - m_j;
        var_n += var_j * n_j + delta * delta * n * n_j / (n + n_j);
        avg = (n * avg + n_j * m_j) / (n + n_j);
        n += n_j;
      }
      mean[c] = avg;
      const double var_biased = var_n / n;
      // PyTorch's inv_std: 0 (not inf) when var + eps == 0, so a constant channel with eps = 0 gives y = 0.
      invstd[c] = var_biased + o.eps == 0 ? 0.0 : 1.0 / std::sqrt(var_biased + o.eps);
      var_unbiased[c] = var_n / (n - 1);
    }
    mean_t = Tensor::from_vector(mean, {C}, topt);
    invstd_t = Tensor::from_vector(invstd, {C}, topt);
    if (o.track_running_stats) {
      Tensor rm = running_mean, rv = running_var;  // handles: the update lands in the buffers
      rm.mul_(1.0 - o.momentum);
      rm.add_(mean_t, o.momentum);
      rv.mul_(1.0 - o.momentum);
      rv.add_(Tensor::from_vector(var_unbiased, {C}, topt), o.momentum);
    }
    count_batch();

    // 4. y = (x - mean) * invstd * weight + bias
    y = mul(sub(x3, mean_t.view(param_shape)), invstd_t.view(param_shape));
    if (weight.defined()) y = mul(y, weight.detach().view(param_shape));
    if (bias.defined()) y = add(y, bias.detach().view(param_shape));
    y = y.reshape(x.shape());
  }

  // Backward (grad mode off inside): the gradient w.r.t. x through the merged statistics needs the group's
  // sum_dy and sum_dy_xmu, hence one all_reduce, issued only when x needs a gradient (as in PyTorch; the
  // condition is the same on every member of a DDP model).
  const bool x_needs = x.requires_grad();
  const bool w_needs = weight.defined() && weight.requires_grad();
  const bool b_needs = bias.defined() && bias.requires_grad();
  autograd::record(
      y, {x, weight, bias}, "SyncBatchNormBackward",
      [x3, mean_t, invstd_t, w = weight.defined() ? weight.detach() : Tensor(), group = group_, rank = rank_, total,
       x_shape = x.shape(), N, C, S, param_shape, x_needs, w_needs, b_needs](const Tensor& g) -> std::vector<Tensor> {
        // dy: x's shape viewed as (N, C, S)
        Tensor dy3 = g.reshape({N, C, S});
        Tensor xmu = sub(x3, mean_t.view(param_shape));
        Tensor sum_dy = sum(dy3, {0, 2});                 // (C), local
        Tensor sum_dy_xmu = sum(mul(dy3, xmu), {0, 2});   // (C), local
        Tensor grad_weight = w_needs ? mul(sum_dy_xmu, invstd_t) : Tensor();
        Tensor grad_bias = b_needs ? sum_dy : Tensor();
        Tensor grad_x;
        if (x_needs) {
          Tensor both = cat({sum_dy, sum_dy_xmu});  // (2C), a fresh buffer: the local sums stay local
          group->all_reduce(rank, both, ReduceOp::Sum);
          Tensor mean_dy = mul(both.narrow(0, 0, C), 1.0 / total);
          Tensor mean_dy_xmu = mul(both.narrow(0, C, C), 1.0 / total);
          Tensor scale = w.defined() ? mul(invstd_t, w) : invstd_t;
          Tensor proj = mul(square(invstd_t), mean_dy_xmu);  // invstd^2 * sum_dy_xmu / N
          grad_x = mul(sub(sub(dy3, mean_dy.view(param_shape)), mul(xmu, proj.view(param_shape))),
                       scale.view(param_shape))
                       .reshape(x_shape);
        }
        return {grad_x, grad_weight, grad_bias};
      });
  return y;
}

template <typename BN>
std::shared_ptr<SyncBatchNorm> SyncBatchNorm::adopt(const BN& bn) {
  const BatchNormOptions& o = bn.options();
  auto sync = std::make_shared<SyncBatchNorm>(o.num_features, o.eps, o.momentum, o.affine, o.track_running_stats);
  sync->clear_registrations();
  sync->weight = sync->bias = sync->running_mean = sync->running_var = sync->num_batches_tracked = Tensor();
  // Same names and order as reset(); register_parameter keeps a leaf's handle (and its requires_grad).
  if (o.affine) {
    sync->weight = sync->register_parameter("weight", bn.weight, bn.weight.requires_grad());
    sync->bias = sync->register_parameter("bias", bn.bias, bn.bias.requires_grad());
  }
  if (o.track_running_stats) {
    sync->running_mean = sync->register_buffer("running_mean", bn.running_mean);
    sync->running_var = sync->register_buffer("running_var", bn.running_var);
    sync->num_batches_tracked = sync->register_buffer("num_batches_tracked", bn.num_batches_tracked);
  }
  sync->train(bn.is_training());
  return sync;
}

std::shared_ptr<SyncBatchNorm> SyncBatchNorm::from_batchnorm(const BatchNorm1d& bn) { return adopt(bn); }
std::shared_ptr<SyncBatchNorm> SyncBatchNorm::from_batchnorm(const BatchNorm2d& bn) { return adopt(bn); }

namespace {

std::shared_ptr<SyncBatchNorm> sync_version(const Module& m) {
  if (const auto* bn = dynamic_cast<const BatchNorm1d*>(&m)) return SyncBatchNorm::from_batchnorm(*bn);
  if (const auto* bn = dynamic_cast<const BatchNorm2d*>(&m)) return SyncBatchNorm::from_batchnorm(*bn);
  return nullptr;
}

bool is_batchnorm(const Module& m) {
  return dynamic_cast<const BatchNorm1d*>(&m) != nullptr || dynamic_cast<const BatchNorm2d*>(&m) != nullptr;
}

// Containers reach their children only through the registry and clone child by child.
bool is_container(const Module& m) {
  return dynamic_cast<const Sequential*>(&m) != nullptr || dynamic_cast<const ModuleList*>(&m) != nullptr ||
         dynamic_cast<const ModuleDict*>(&m) != nullptr;
}

struct Replacement {
  Module* parent;
  std::string name;
  std::shared_ptr<Module> batchnorm;
};

// Collects every BatchNorm child below `m` (at `path`); `blocker` names the nearest non-container on the
// path from the root ("" when there is none), which makes a BatchNorm below it an error.
void find_batchnorms(Module& m, const std::string& path, const std::string& blocker,
                     std::vector<Replacement>& found) {
  std::string here = blocker;
  if (here.empty() && !is_container(m)) {
    here = (path.empty() ? std::string("the root") : "'" + path + "'") + " (" + m.type_name() + ")";
  }
  for (const auto& [name, child] : m.named_children()) {
    const std::string child_path = path.empty() ? name : path + "." + name;
    if (is_batchnorm(*child)) {
      DPE_CHECK(here.empty(), "convert_sync_batchnorm: cannot replace '", child_path, "' (", child->type_name(),
                "): it lies under ", here,
                ", a custom module whose typed members and clone() would keep the BatchNorm; only Sequential, "
                "ModuleList and ModuleDict are converted in place (build such a model with nn::SyncBatchNorm)");
      found.push_back({&m, name, child});
    } else {
      find_batchnorms(*child, child_path, here, found);
    }
  }
}

}  // namespace

std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> module) {
  DPE_CHECK(module != nullptr, "convert_sync_batchnorm: null module");
  if (auto sync = sync_version(*module)) return sync;
  std::vector<Replacement> found;
  find_batchnorms(*module, "", "", found);  // throws before anything changes
  // A BatchNorm registered in several places becomes one SyncBatchNorm, registered in the same places.
  std::map<const Module*, std::shared_ptr<SyncBatchNorm>> converted;
  for (const Replacement& r : found) {
    auto& sync = converted[r.batchnorm.get()];
    if (sync == nullptr) sync = sync_version(*r.batchnorm);
    r.parent->replace_module(r.name, sync);
  }
  return module;
}

int set_sync_batchnorm_group(Module& module, const std::shared_ptr<ProcessGroup>& group, int rank) {
  int count = 0;
  if (auto* sync = dynamic_cast<SyncBatchNorm*>(&module)) {
    sync->set_process_group(group, rank);
    ++count;
  }
  for (const auto& [name, child] : module.named_children()) count += set_sync_batchnorm_group(*child, group, rank);
  return count;
}

}  // namespace dpe::nn
