#include "tests/testing/gradcheck.h"

#include <cmath>
#include <random>
#include <sstream>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"

namespace dpe::testing {

namespace {

double weighted_sum(const TensorFn& fn, const std::vector<Tensor>& inputs, const std::vector<double>& w) {
  NoGradGuard no_grad;
  std::vector<double> out = fn(inputs).to_vector<double>();
  double total = 0.0;
  for (size_t i = 0; i < out.size(); ++i) total += out[i] * w[i];
  return total;
}

}  // namespace

std::string gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  for (const Tensor& t : inputs) {
    DPE_CHECK(t.dtype() == DType::Float64, "gradcheck: inputs must be float64, got ", t.dtype());
  }
  std::mt19937_64 rng(options.seed);
  std::normal_distribution<double> normal;
  std::ostringstream failures;
  int reported = 0;
  for (int projection = 0; projection < options.num_projections; ++projection) {
    for (const Tensor& t : inputs) {
      if (t.requires_grad()) t.set_grad({});
    }
    Tensor out = fn(inputs);
    std::vector<double> w(static_cast<size_t>(out.numel()));
    for (double& v : w) v = normal(rng);
    Tensor w_tensor = Tensor::from_vector(w, out.shape(), TensorOptions(DType::Float64).with_device(out.device()));
    out.backward(w_tensor);

    for (size_t k = 0; k < inputs.size(); ++k) {
      const Tensor& input = inputs[k];
      if (!input.requires_grad()) continue;
      std::vector<double> analytical =
          input.grad().defined() ? input.grad().to_vector<double>() : std::vector<double>(input.numel(), 0.0);
      // Perturb a host copy and write it back, element by element.
      std::vector<double> values = input.to_vector<double>();
      for (size_t i = 0; i < values.size(); ++i) {
        double original = values[i];
        auto evaluate = [&](double x) {
          values[i] = x;
          NoGradGuard no_grad;
          Tensor host = Tensor::from_vector(values, input.shape(), TensorOptions(DType::Float64));
          input.detach().copy_(host);
          return weighted_sum(fn, inputs, w);
        };
        double plus = evaluate(original + options.eps);
        double minus = evaluate(original - options.eps);
        evaluate(original);
        double numerical = (plus - minus) / (2 * options.eps);
        double diff = std::abs(numerical - analytical[i]);
        if (!(diff <= options.atol + options.rtol * std::abs(numerical))) {
          if (reported++ < 5) {
            failures << "input " << k << " element " << i << ": analytical " << analytical[i] << ", numerical "
                     << numerical << " (projection " << projection << ")\n";
          }
        }
      }
    }
  }
  if (reported > 5) failures << "... " << reported - 5 << " more mismatches\n";
  return failures.str();
}

Tensor randn_away_from(const Shape& shape, double kink, double margin, uint64_t seed, Device device) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  for (double& v : values) {
    do {
      v = normal(rng);
    } while (std::abs(v - kink) < margin);
  }
  return Tensor::from_vector(values, shape, TensorOptions(DType::Float64).with_device(device)).set_requires_grad(true);
}

Tensor randn_leaf(const Shape& shape, uint64_t seed, Device device) {
  return randn_away_from(shape, 0.0, 0.0, seed, device);
}

}  // namespace dpe::testing
