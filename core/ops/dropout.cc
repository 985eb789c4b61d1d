// Inverted dropout from a Bernoulli mask (see core/ops/dropout.h).
#include "core/ops/dropout.h"

#include "core/ops/op_checks.h"

namespace dpe {

// x: any shape  ->  x's shape
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  DPE_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability has to be between 0 and 1, but got ", p);
  detail::check_compute_dtype(x, "dropout");
  if (!training || p == 0.0) return x;
  if (p == 1.0) return mul(x, zeros_like(x));  // keeps the graph: the gradient is zero
  // The mask carries the scale (values 0 or 1/(1-p)), so mul's backward is dy * mask / (1 - p).
  Tensor mask = bernoulli(x.shape(), 1.0 - p, detail::options_of(x), gen);
  mask.mul_(1.0 / (1.0 - p));
  return mul(x, mask);
}

}  // namespace dpe
