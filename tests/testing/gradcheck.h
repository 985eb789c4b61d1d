// Numerical gradient check in double precision (central differences), used by every differentiable op
// and layer test.
//
// For a function f of several tensors with a tensor output, gradcheck draws a random weight w of the
// output's shape (seeded), so that L(inputs) = sum(f(inputs) * w) is a scalar, and compares
//   analytical: dL/dx from dpe's backward (with gradient w at the output)
//   numerical:  (L(x + eps e_i) - L(x - eps e_i)) / (2 eps) for every element i of every input
// Two draws of w make a wrong Jacobian row or column show up with probability ~1.
//
// Kinks (ReLU at 0, max ties) break finite differences: give inputs away from them (randn_away_from).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dpe::testing {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-6;
  double rtol = 1e-4;
  uint64_t seed = 1701;
  int num_projections = 2;
};

using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Returns "" when every gradient matches, else a description of the first mismatches (input, element,
// analytical, numerical). Inputs must be float64; those with requires_grad are checked.
std::string gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

// float64 N(0,1) values on `device`, each at least `margin` away from `kink` (resampled), requires_grad set.
Tensor randn_away_from(const Shape& shape, double kink, double margin, uint64_t seed,
                       Device device = Device::cpu(0));

// float64 N(0,1) leaf with requires_grad.
Tensor randn_leaf(const Shape& shape, uint64_t seed, Device device = Device::cpu(0));

}  // namespace dpe::testing
