// The smallest end-to-end check of dpe's core, until the `dpe` tool exists (issue "The dpe tool").
//
// 1. Lists the devices this build sees.
// 2. Trains a 2-layer MLP (32 -> 64 -> 4) with plain SGD, written with core ops and autograd, on a
//    synthetic classification task; the loss must fall.
// 3. Splits one batch in two halves on cpu:0 and cpu:1 (on CUDA devices when there are two), computes the
//    gradients on each, sums them, and compares with the full-batch gradient: the identity DP relies on.
#include <cstdio>
#include <vector>

#include "core/allocator.h"
#include "core/autograd/grad_mode.h"
#include "core/ops.h"

using namespace dpe;

struct Mlp {
  Tensor w1, b1, w2, b2;

  Mlp(Device device, uint64_t seed) {
    Generator gen(seed);
    TensorOptions opts = TensorOptions(device);
    w1 = (randn({32, 64}, opts, &gen) * 0.15).detach().set_requires_grad(true);
    b1 = zeros({64}, opts.with_requires_grad(true));
    w2 = (randn({64, 4}, opts, &gen) * 0.15).detach().set_requires_grad(true);
    b2 = zeros({4}, opts.with_requires_grad(true));
  }
  std::vector<Tensor> parameters() const { return {w1, b1, w2, b2}; }
  Tensor forward(const Tensor& x) const { return matmul(relu(matmul(x, w1) + b1), w2) + b2; }
};

// Mean cross-entropy of logits (N, C) against one-hot targets (N, C), times `scale`.
Tensor cross_entropy(const Tensor& logits, const Tensor& one_hot, double scale) {
  return sum(log_softmax(logits, 1) * one_hot) * (-scale);
}

int main() {
  std::printf("dpe core smoke test\n");
  for (DeviceKind kind : {DeviceKind::CPU, DeviceKind::CUDA}) {
    for (const Device& d : all_devices(kind)) std::printf("  device %s\n", d.str().c_str());
  }
  if (!cuda_available()) std::printf("  (no CUDA device: running on CPU devices)\n");
  Device d0 = cuda_device_count() >= 2 ? Device::cuda(0) : Device::cpu(0);
  Device d1 = cuda_device_count() >= 2 ? Device::cuda(1) : Device::cpu(1);

  // Synthetic task: the class is the argmax of a fixed random projection of the input.
  constexpr int64_t kBatch = 128;
  Generator data_gen(1);
  Tensor x = randn({kBatch, 32}, TensorOptions(d0), &data_gen);
  Tensor projection = randn({32, 4}, TensorOptions(d0), &data_gen);
  std::vector<int64_t> labels = argmax(matmul(x, projection), 1).to_vector<int64_t>();
  std::vector<float> one_hot_values(kBatch * 4, 0.0f);
  for (int64_t i = 0; i < kBatch; ++i) one_hot_values[i * 4 + labels[i]] = 1.0f;
  Tensor one_hot = Tensor::from_vector(one_hot_values, {kBatch, 4}, TensorOptions(d0));

  Mlp model(d0, 42);
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < 60; ++step) {
    Tensor loss = cross_entropy(model.forward(x), one_hot, 1.0 / kBatch);
    loss.backward();
    NoGradGuard no_grad;
    for (Tensor& p : model.parameters()) {
      p.add_(p.grad(), -0.5);
      p.set_grad({});
    }
    last_loss = loss.item();
    if (step == 0) first_loss = last_loss;
    if (step % 10 == 0 || step == 59) std::printf("  step %2d  loss %.4f\n", step, last_loss);
  }
  bool learned = last_loss < 0.5 * first_loss;
  std::printf("loss %.4f -> %.4f: %s\n", first_loss, last_loss, learned ? "ok" : "DID NOT LEARN");

  // Two-device split: replica on d1 holds a copy of the parameters; each half-batch loss is scaled by
  // 1/kBatch so that the summed gradients equal the full-batch mean's gradient.
  Mlp replica(d1, 0);
  {
    NoGradGuard no_grad;
    std::vector<Tensor> src = model.parameters(), dst = replica.parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  std::vector<Tensor> xs = x.chunk(2), ys = one_hot.chunk(2);
  cross_entropy(model.forward(xs[0]), ys[0], 1.0 / kBatch).backward();
  cross_entropy(replica.forward(xs[1].to(d1)), ys[1].to(d1), 1.0 / kBatch).backward();
  Mlp reference(d0, 0);
  {
    NoGradGuard no_grad;
    std::vector<Tensor> src = model.parameters(), dst = reference.parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  cross_entropy(reference.forward(x), one_hot, 1.0 / kBatch).backward();
  double worst = 0;
  std::vector<Tensor> a = model.parameters(), b = replica.parameters(), r = reference.parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    Tensor summed = a[i].grad() + b[i].grad().to(d0);
    worst = std::max(worst, max_abs_diff(summed, r[i].grad()));
  }
  bool equivalent = worst < 1e-5;
  std::printf("split-batch gradients (%s + %s) vs full batch: max |diff| = %.2e: %s\n", d0.str().c_str(),
              d1.str().c_str(), worst, equivalent ? "ok" : "MISMATCH");
  for (const Device& d : {d0, d1}) {
    MemoryStats s = memory_stats(d);
    std::printf("  %s: %lld bytes allocated now, peak %lld\n", d.str().c_str(),
                static_cast<long long>(s.allocated_bytes), static_cast<long long>(s.peak_allocated_bytes));
  }
  return learned && equivalent ? 0 : 1;
}
