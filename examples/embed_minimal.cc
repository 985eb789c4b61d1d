// The smallest C++ program that embeds dpe: a module of your own, wrapped in DataParallel, trained with the
// step API (set_optimizer + train_step).
//
// 1. Defines a 2-layer MLP the way PyTorch's C++ frontend does: children registered by name, built in
//    reset() so that DataParallel can clone the replicas it needs.
// 2. Wraps it in DataParallel over every device (every GPU if there is one, else every CPU device). DP mode
//    by default; --ddp switches to DistributedDataParallel's algorithm, and that one option is the only change.
// 3. Learns y = x . w + 0.5 + noise from fresh synthetic batches, printing the mean loss of every 25 steps,
//    then the phase times of the last step. With even shards both modes print the same losses.
//
//   bazel run //examples:embed_minimal            # DP: scatter, replicate, gather, reduce into the master
//   bazel run //examples:embed_minimal -- --ddp   # DDP: a loss per replica, gradients all-reduced in buckets
//   DPE_NUM_CPU_DEVICES=4 bazel run //examples:embed_minimal   # four CPU devices instead of one per core
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "core/ops.h"
#include "engine/data_parallel.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "optim/sgd.h"

using namespace dpe;

// x: (N, in)  ->  (N, out)
class Mlp : public nn::Cloneable<Mlp> {
 public:
  Mlp(int64_t in, int64_t hidden, int64_t out) : Cloneable("Mlp"), in_(in), hidden_(hidden), out_(out) { reset(); }

  void reset() override {  // (re)creates every child: a replica is a copy whose reset() runs again
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(in_, hidden_));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(hidden_, out_));
  }

  Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }

  std::shared_ptr<nn::Linear> fc1, fc2;

 private:
  int64_t in_, hidden_, out_;
};

int main(int argc, char** argv) {
  const bool ddp = argc == 2 && std::strcmp(argv[1], "--ddp") == 0;
  if (argc > 1 && !ddp) {
    std::fprintf(stderr, "usage: embed_minimal [--ddp]\n");
    return 2;
  }
  constexpr int64_t kFeatures = 8, kBatch = 64, kSteps = 200;
  manual_seed(0);

  // The module lives on the first device DataParallel will use (its default device_ids: every GPU if there
  // is one, else cpu:0..cpu:N-1). Replicas for the other devices are cloned once, at construction.
  const Device first = cuda_available() ? Device::cuda(0) : Device::cpu(0);
  auto model = std::make_shared<Mlp>(kFeatures, 32, 1);
  model->to(first);
  DataParallel dp(model, {.mode = ddp ? ParallelMode::DDP : ParallelMode::DP});  // the one switch

  // DP calls the factory once (the master's optimizer), DDP once per replica.
  dp.set_optimizer([](const std::vector<Tensor>& params) {
    return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.02, .momentum = 0.9});
  });
  // DP: runs once, on the gathered output. DDP: runs on each replica's shard, on its worker thread.
  LossFn loss_fn = [](const Tensor& output, const Tensor& target) { return nn::functional::mse_loss(output, target); };

  std::printf("embed_minimal: %s mode on", mode_name(dp.options().mode));
  for (const Device& d : dp.device_ids()) std::printf(" %s", d.str().c_str());
  std::printf(", batch %lld\n", static_cast<long long>(kBatch));

  // Synthetic regression: y = x . w + 0.5 + noise with standard deviation 0.1 (so the best loss is 0.01).
  Generator data_gen(1);
  Tensor w = randn({kFeatures, 1}, {}, &data_gen);
  double recent = 0;  // mean loss of the last 25 steps
  for (int64_t step = 1; step <= kSteps; ++step) {
    Tensor x = randn({kBatch, kFeatures}, {}, &data_gen);  // on cpu:0; DataParallel scatters it
    Tensor y = matmul(x, w) + 0.5 + randn({kBatch, 1}, {}, &data_gen) * 0.1;
    double loss = dp.train_step(x, y, loss_fn);  // zero_grad, forward, loss, backward, reduce, optimizer step
    recent += loss / 25;
    if (step % 25 == 0) {
      std::printf("  steps %3lld-%3lld  mean loss %.4f\n", static_cast<long long>(step - 24),
                  static_cast<long long>(step), recent);
      if (step < kSteps) recent = 0;
    }
  }

  const StepReport& r = dp.last_step();
  std::printf("last step: chunk sizes");
  for (int64_t s : r.chunk_sizes) std::printf(" %lld", static_cast<long long>(s));
  std::printf("\n  ms: scatter %.3f  broadcast %.3f  forward %.3f  gather %.3f  loss %.3f  backward %.3f"
              " (reduce %.3f of it)  optimizer %.3f\n",
              r.scatter_ms, r.broadcast_ms, r.forward_ms, r.gather_ms, r.loss_ms, r.backward_ms, r.reduce_ms,
              r.optimizer_ms);
  std::printf("final loss %.4f\n", recent);
  return 0;
}
