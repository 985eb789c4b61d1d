// Value comparisons on the host (tests, tools). Not differentiable.
#include <cmath>

#include "core/ops.h"
#include "core/ops/op_checks.h"

namespace dpe {

namespace {
void check_comparable(const Tensor& a, const Tensor& b, const char* op) {
  detail::check_defined(a, op);
  detail::check_defined(b, op);
  DPE_CHECK(a.shape() == b.shape(), op, ": shapes differ: ", shape_str(a.shape()), " vs ", shape_str(b.shape()));
}
}  // namespace

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  check_comparable(a, b, "allclose");
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) return false;
    if (std::abs(x[i] - y[i]) > atol + rtol * std::abs(y[i])) return false;
  }
  return true;
}

bool equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.shape() != b.shape()) return false;
  return a.to_vector<double>() == b.to_vector<double>();
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  check_comparable(a, b, "max_abs_diff");
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

}  // namespace dpe
