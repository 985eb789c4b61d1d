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

double grad_norm_power(const std::vector<Tensor>& params, double norm_type) {
  DPE_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive, got ", norm_type);
  NoGradGuard no_grad;
  double total = 0.0;
  for (const Tensor& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    if (std::isinf(norm_type)) {
      total = std::max(total, norm_of(p.grad(), norm_type));
    } else {
      total += std::pow(norm_of(p.grad(), norm_type), norm_type);
    }
  }
  return total;
}

void clip_grads_with_norm_(const std::vector<Tensor>& params, double max_norm, double total_norm) {
  const double coef = max_norm / (total_norm + 1e-6);
  if (coef >= 1.0) return;
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor g = p.grad();
    g.mul_(coef);
  }
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  const double power = grad_norm_power(params, norm_type);
  const double total = std::isinf(norm_type) ? power : std::pow(power, 1.0 / norm_type);
  clip_grads_with_norm_(params, max_norm, total);
  return total;
}

}  // namespace dpe::optim
