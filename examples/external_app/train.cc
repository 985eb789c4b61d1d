// An application outside dpe's repository that trains with it: a tiny MLP on synthetic data, in DP and then
// in DDP mode on two CPU devices. Exits 1 unless the loss falls in both modes, so a build of dpe that is
// usable from another workspace is one that passes here (tools/embedding_test.sh runs it).
//
//   bazel run --config=cpu_only //:train
#include <cstdio>
#include <memory>
#include <vector>

#include "core/ops.h"
#include "engine/data_parallel.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "optim/sgd.h"

namespace {

using namespace dpe;

class Mlp : public nn::Cloneable<Mlp> {
 public:
  Mlp() : Cloneable("Mlp") { reset(); }

  void reset() override {  // DataParallel's replicas are clones whose reset() runs again
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kFeatures, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 1));
  }

  Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }

  static constexpr int64_t kFeatures = 4;
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// Mean loss of the first and of the last 10 of 100 steps on y = x . w + 1 + noise (noise variance 0.01).
struct Losses {
  double first = 0, last = 0;
};

Losses train(ParallelMode mode) {
  constexpr int64_t kBatch = 32, kSteps = 100, kWindow = 10;
  manual_seed(0);
  auto model = std::make_shared<Mlp>();  // on cpu:0, the first of device_ids
  DataParallel dp(model, {.device_ids = std::vector{Device::cpu(0), Device::cpu(1)}, .mode = mode});
  dp.set_optimizer([](const std::vector<Tensor>& params) {
    return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.02, .momentum = 0.9});
  });
  LossFn mse = [](const Tensor& out, const Tensor& target) { return nn::functional::mse_loss(out, target); };

  Generator gen(1);
  Tensor w = randn({Mlp::kFeatures, 1}, {}, &gen);
  Losses losses;
  for (int64_t step = 0; step < kSteps; ++step) {
    Tensor x = randn({kBatch, Mlp::kFeatures}, {}, &gen);
    Tensor y = matmul(x, w) + 1.0 + randn({kBatch, 1}, {}, &gen) * 0.1;
    double loss = dp.train_step(x, y, mse);
    if (step < kWindow) losses.first += loss / kWindow;
    if (step >= kSteps - kWindow) losses.last += loss / kWindow;
  }
  return losses;
}

}  // namespace

int main() {
  bool ok = true;
  for (ParallelMode mode : {ParallelMode::DP, ParallelMode::DDP}) {
    Losses l = train(mode);
    // The first steps average well above 1 (the bias alone contributes 1); a trained model is near 0.01.
    const bool fell = l.last < 0.1 && l.last < l.first / 5;
    std::printf("external_app: %s on cpu:0,cpu:1: mean loss %.4f (first 10 steps) -> %.4f (last 10): %s\n",
                mode_name(mode), l.first, l.last, fell ? "ok" : "did not fall");
    ok = ok && fell;
  }
  return ok ? 0 : 1;
}
