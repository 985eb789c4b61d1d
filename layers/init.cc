#include "layers/init.h"

#include <cmath>

#include "core/autograd/grad_mode.h"
#include "core/error.h"

namespace dpe::nn::init {

int64_t fan_in(const Tensor& weight) {
  DPE_CHECK(weight.dim() >= 2, "fan_in: expected a weight with at least 2 dimensions, got ", shape_str(weight.shape()));
  int64_t receptive = 1;
  for (int64_t d = 2; d < weight.dim(); ++d) receptive *= weight.size(d);
  return weight.size(1) * receptive;
}

void uniform_fan_in_(Tensor& t, int64_t fan_in) {
  double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  uniform_(t, -bound, bound);
}

void uniform_(Tensor& t, double low, double high) {
  NoGradGuard no_grad;
  t.detach().uniform_(low, high);
}

void normal_(Tensor& t, double mean, double std) {
  NoGradGuard no_grad;
  t.detach().normal_(mean, std);
}

void zeros_(Tensor& t) {
  NoGradGuard no_grad;
  t.detach().zero_();
}

void ones_(Tensor& t) {
  NoGradGuard no_grad;
  t.detach().fill_(1.0);
}

}  // namespace dpe::nn::init
