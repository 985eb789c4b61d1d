#include "optim/clip_grad.h"

#include <algorithm>
#include <cmath>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"

namespace dpe::optim {
namespace {

// ||g||_p of one gradient, in double. The 2-norm and the max run on g's device (one scalar comes back);
// other p copy g to the host.
double norm_of(const Tensor& g, double p) {
  if (g.numel() == 0) return 0.0;
  if (std::isinf(p)) return std::max(max(g).item(), -min(g).item());
  if (p == 2.0) return std::sqrt(sum(square(g)).item());
  double acc = 0.0;
  for (double v : g.to_vector<double>()) acc += std::pow(std::abs(v), p);
  return std::pow(acc, 1.0 / p);
}

}  // namespace

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  DPE_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive, got ", norm_type);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0.0;
  double total = 0.0;
  if (std::isinf(norm_type)) {
    for (const Tensor& g : grads) total = std::max(total, norm_of(g, norm_type));
  } else {
    for (const Tensor& g : grads) total += std::pow(norm_of(g, norm_type), norm_type);
    total = std::pow(total, 1.0 / norm_type);
  }
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    for (Tensor& g : grads) g.mul_(coef);
  }
  return total;
}

}  // namespace dpe::optim
