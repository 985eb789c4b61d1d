// Fashion-MNIST in DP or DDP mode: the same model, data and global batch, one switch apart.
//
// Trains a built-in model (models/models.h: "cnn" with BatchNorm, or "mlp") on Fashion-MNIST read from
// Debian's dataset-fashion-mnist (data/fashion_mnist.h), batches from data::DataLoader, across every device
// (every GPU if there is one, else every CPU device). After each epoch it measures test accuracy on replica 0
// (the master in DP mode; in DDP mode every replica holds the same weights).
//
//   bazel run //examples:fashion_mnist -- --mode dp --epochs 2
//   bazel run //examples:fashion_mnist -- --mode ddp --model mlp --epochs 3 --limit 10000
//
// Flags: --mode dp|ddp (dp), --model cnn|mlp (cnn), --epochs N (2), --limit N (every sample: 60000 to train,
// 10000 to test; with N, the first N of each), --batch-size N (128, the global batch split across devices).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/ops.h"
#include "data/data_loader.h"
#include "data/fashion_mnist.h"
#include "engine/data_parallel.h"
#include "layers/loss.h"
#include "models/models.h"
#include "optim/sgd.h"

using namespace dpe;

int main(int argc, char** argv) {
  std::string mode = "dp", model_name = "cnn";
  int64_t epochs = 2, limit = -1, batch_size = 128;
  auto is_count = [](const std::string& v) {  // a non-negative number that fits easily in int64
    return !v.empty() && v.size() < 10 && v.find_first_not_of("0123456789") == std::string::npos;
  };
  for (int i = 1; i < argc; i += 2) {
    std::string flag = argv[i], value = i + 1 < argc ? argv[i + 1] : "";
    if (flag == "--mode" && (value == "dp" || value == "ddp")) mode = value;
    else if (flag == "--model" && (value == "cnn" || value == "mlp")) model_name = value;
    else if (flag == "--epochs" && is_count(value)) epochs = std::stoll(value);
    else if (flag == "--limit" && is_count(value)) limit = std::stoll(value);
    else if (flag == "--batch-size" && is_count(value)) batch_size = std::stoll(value);
    else {
      std::fprintf(stderr, "bad argument '%s %s'; usage: fashion_mnist [--mode dp|ddp] [--model cnn|mlp] "
                   "[--epochs N] [--limit N] [--batch-size N]\n", flag.c_str(), value.c_str());
      return 2;
    }
  }

  try {
    // images: (N, 1, 28, 28) float32, normalised; labels: (N) int64 in [0, 10); both on cpu:0.
    data::Dataset train = data::load_fashion_mnist(data::kFashionMnistDir, data::Split::Train, {.limit = limit});
    data::Dataset test = data::load_fashion_mnist(data::kFashionMnistDir, data::Split::Test, {.limit = limit});

    manual_seed(42);
    const Device first = cuda_available() ? Device::cuda(0) : Device::cpu(0);
    std::shared_ptr<nn::Module> model = models::make_model(model_name);  // built on cpu:0
    model->to(first);                                                     // the master lives on device_ids[0]
    DataParallel dp(model, {.mode = mode == "ddp" ? ParallelMode::DDP : ParallelMode::DP});
    dp.set_optimizer([](const std::vector<Tensor>& params) {
      return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    });
    // logits: (B, 10)  labels: (B). DP: the whole gathered batch; DDP: each replica's own shard.
    LossFn loss_fn = [](const Tensor& logits, const Tensor& labels) {
      return nn::functional::cross_entropy(logits, labels);
    };

    // The loader yields the GLOBAL batch; DataParallel splits it across the devices. DDP needs at least one
    // sample per device, so the short last batch is dropped. On GPUs, batches in pinned memory copy asynchronously.
    data::DataLoader loader(train.images, train.labels, {.batch_size = batch_size, .seed = 42, .drop_last = true,
                                                         .pin_memory = dp.device_ids()[0].is_cuda()});
    std::printf("fashion_mnist: %s, %s mode on", model_name.c_str(), mode.c_str());
    for (const Device& d : dp.device_ids()) std::printf(" %s", d.str().c_str());
    std::printf("; %lld training and %lld test samples, global batch %lld\n", static_cast<long long>(train.size()),
                static_cast<long long>(test.size()), static_cast<long long>(batch_size));

    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      auto start = std::chrono::steady_clock::now();
      loader.begin_epoch(epoch);  // a new shuffle each epoch
      double loss_sum = 0;
      int64_t batches = 0;
      while (std::optional<data::Batch> batch = loader.next()) {
        loss_sum += dp.train_step(batch->inputs, batch->targets, loss_fn);
        ++batches;
      }

      // Test accuracy on replica 0, one slice of the test set at a time, without recording a graph.
      // eval(): BatchNorm normalises with its running statistics instead of the batch's.
      int64_t correct = 0;
      {
        NoGradGuard no_grad;
        nn::Module& net = dp.module();
        net.eval();
        for (int64_t begin = 0; begin < test.size(); begin += 1000) {
          int64_t n = std::min<int64_t>(1000, test.size() - begin);
          Tensor logits = net.forward(test.images.narrow(0, begin, n).to(first));  // (n, 10)
          std::vector<int64_t> predicted = argmax(logits, 1).to_vector<int64_t>();
          std::vector<int64_t> labels = test.labels.narrow(0, begin, n).to_vector<int64_t>();
          for (int64_t i = 0; i < n; ++i) correct += predicted[i] == labels[i];
        }
        net.train();
      }
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("epoch %lld/%lld  train loss %.4f  test accuracy %.4f  (%.1f s)\n",
                  static_cast<long long>(epoch + 1), static_cast<long long>(epochs),
                  batches > 0 ? loss_sum / static_cast<double>(batches) : 0.0,
                  static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(test.size(), 1)), seconds);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
  return 0;
}
