// Tensor creation and random fills.
#include "core/copy.h"
#include "core/dispatch.h"
#include "core/kernels/random.h"
#include "core/ops.h"
#include "core/ops/op_checks.h"

#include <deque>

namespace dpe {

Tensor full(const Shape& shape, double value, TensorOptions options) {
  bool requires_grad = options.requires_grad;
  Tensor t = Tensor::empty(shape, options.with_requires_grad(false));
  fill_into(t, value);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor zeros(const Shape& shape, TensorOptions options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1.0, options); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), detail::options_of(t)); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), detail::options_of(t)); }
Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), detail::options_of(t)); }
Tensor scalar_tensor(double value, TensorOptions options) { return full({}, value, options); }

Tensor arange(int64_t n, TensorOptions options) {
  DPE_CHECK(n >= 0, "arange: expected n >= 0, got ", n);
  std::vector<double> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<double>(i);
  Tensor host = Tensor::from_vector(values, {n});
  return host.to(options.dtype).to(options.device);
}

// ---- generators ----

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard lock(mutex_);
  seed_ = seed;
  offset_ = 0;
}

uint64_t Generator::seed() const {
  std::lock_guard lock(mutex_);
  return seed_;
}

uint64_t Generator::offset() const {
  std::lock_guard lock(mutex_);
  return offset_;
}

void Generator::set_offset(uint64_t offset) {
  std::lock_guard lock(mutex_);
  offset_ = offset;
}

uint64_t Generator::advance(uint64_t n) {
  std::lock_guard lock(mutex_);
  uint64_t first = offset_;
  offset_ += n;
  return first;
}

namespace {

uint64_t& global_seed() {
  static uint64_t seed = 0;
  return seed;
}

std::mutex& generators_mutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}

}  // namespace

Generator& default_generator(const Device& d) {
  check_device_exists(d);
  // Never destroyed, like the allocators: referenced from worker threads until process exit.
  static auto* per_kind = new std::deque<std::unique_ptr<Generator>>[2];
  std::lock_guard lock(generators_mutex());
  auto& generators = per_kind[static_cast<int>(d.kind)];
  while (static_cast<int>(generators.size()) <= d.index) {
    generators.push_back(std::make_unique<Generator>(global_seed()));
  }
  return *generators[d.index];
}

void manual_seed(uint64_t seed) {
  {
    std::lock_guard lock(generators_mutex());
    global_seed() = seed;
  }
  for (DeviceKind kind : {DeviceKind::CPU, DeviceKind::CUDA}) {
    for (const Device& d : all_devices(kind)) default_generator(d).manual_seed(seed);
  }
}

namespace {

enum class Distribution { Uniform, Normal, Bernoulli };

Tensor random_tensor(const Shape& shape, TensorOptions options, Generator* gen, Distribution dist, double p) {
  DPE_CHECK(is_compute_type(options.dtype), "random tensors are float32 or float64, got ", options.dtype);
  bool requires_grad = options.requires_grad;
  Tensor t = Tensor::empty(shape, options.with_requires_grad(false));
  Generator& g = gen != nullptr ? *gen : default_generator(options.device);
  kernels::PhiloxState state{g.seed(), g.advance(static_cast<uint64_t>(t.numel()))};
  int64_t n = t.numel();
  DType dtype = t.dtype();
  void* out = t.data_ptr();
  dispatch(
      t.device(),
      [&] {
        switch (dist) {
          case Distribution::Uniform: kernels::uniform_cpu(dtype, n, state, 0.0, 1.0, out); break;
          case Distribution::Normal: kernels::normal_cpu(dtype, n, state, 0.0, 1.0, out); break;
          case Distribution::Bernoulli: kernels::bernoulli_cpu(dtype, n, state, p, out); break;
        }
      },
      [&](auto stream) {
        switch (dist) {
          case Distribution::Uniform: kernels::uniform_cuda(stream, dtype, n, state, 0.0, 1.0, out); break;
          case Distribution::Normal: kernels::normal_cuda(stream, dtype, n, state, 0.0, 1.0, out); break;
          case Distribution::Bernoulli: kernels::bernoulli_cuda(stream, dtype, n, state, p, out); break;
        }
      });
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

}  // namespace

Tensor rand(const Shape& shape, TensorOptions options, Generator* gen) {
  return random_tensor(shape, options, gen, Distribution::Uniform, 0.0);
}

Tensor randn(const Shape& shape, TensorOptions options, Generator* gen) {
  return random_tensor(shape, options, gen, Distribution::Normal, 0.0);
}

Tensor bernoulli(const Shape& shape, double p, TensorOptions options, Generator* gen) {
  DPE_CHECK(p >= 0.0 && p <= 1.0, "bernoulli: probability ", p, " is outside [0, 1]");
  return random_tensor(shape, options, gen, Distribution::Bernoulli, p);
}

}  // namespace dpe
