#include "models/models.h"

#include "core/error.h"
#include "layers/activation.h"
#include "layers/batchnorm.h"
#include "layers/containers.h"
#include "layers/conv.h"
#include "layers/linear.h"
#include "layers/llama.h"
#include "layers/loss.h"
#include "layers/pooling.h"

namespace dpe::models {

namespace {

using ModuleList = std::vector<std::shared_ptr<nn::Module>>;

// layers/llama.h's "tiny" preset: vocab 259, dim 128, 2 layers, 4 heads, hidden 384, max_seq_len 64
// (kTinyLlamaSeqLen; models_test checks the two agree), the layers' default initialisation.
nn::LlamaConfig tiny_llama_config() { return nn::llama_preset("tiny", 259); }

constexpr int64_t kPad = 258;  // data/text_corpus.h's PAD token

}  // namespace

void check_model_name(const std::string& name) {
  for (const std::string& known : kModelNames) {
    if (name == known) return;
  }
  DPE_CHECK(false, "unknown model '", name, "'; expected mlp, cnn or tiny-llama");
}

std::shared_ptr<nn::Module> make_model(const std::string& name) {
  check_model_name(name);
  if (name == "mlp") {
    return std::make_shared<nn::Sequential>(ModuleList{
        std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(784, 512), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(512, 512), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(512, 10)});
  }
  if (name == "cnn") {
    return std::make_shared<nn::Sequential>(ModuleList{
        std::make_shared<nn::Conv2d>(1, 32, 3, 1, 1), std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
        std::make_shared<nn::Conv2d>(32, 64, 3, 1, 1), std::make_shared<nn::BatchNorm2d>(64),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::Flatten>(),
        std::make_shared<nn::Linear>(3136, 128), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(128, 10)});
  }
  return std::make_shared<nn::Llama>(tiny_llama_config());  // check_model_name: the last one left
}

LossFn model_loss(const std::string& name) {
  if (name == "tiny-llama") {
    return [](const Tensor& logits, const Tensor& targets) {
      // (B, T, V) logits against (B, T) next tokens; padding positions do not count.
      return nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
                                           {.ignore_index = kPad});
    };
  }
  check_model_name(name);
  return [](const Tensor& logits, const Tensor& labels) { return nn::functional::cross_entropy(logits, labels); };
}

double train_flops_per_sample(const std::string& name) {
  auto linear = [](double in, double out) { return 2 * in * out; };
  auto conv = [](double hw, double cin, double cout) { return 2 * hw * cin * cout * 9; };
  if (name == "mlp") {
    // The first layer needs no input gradient: 2x its forward; the others 3x.
    return 2 * linear(784, 512) + 3 * (linear(512, 512) + linear(512, 10));
  }
  if (name == "cnn") {
    return 2 * conv(28 * 28, 1, 32) + 3 * (conv(14 * 14, 32, 64) + linear(3136, 128) + linear(128, 10));
  }
  if (name == "tiny-llama") {
    nn::LlamaConfig c = tiny_llama_config();
    double t = static_cast<double>(c.max_seq_len), d = static_cast<double>(c.dim);
    double per_layer = t * (linear(d, 3 * d) + linear(d, d) + 3 * linear(d, static_cast<double>(c.hidden_dim))) +
                       2 * 2 * t * t * d;  // QK^T and AV
    return 3 * (static_cast<double>(c.num_layers) * per_layer + t * linear(d, static_cast<double>(c.vocab_size)));
  }
  check_model_name(name);
  DPE_INTERNAL_ASSERT(false, "no FLOP count for model '", name, "'");
}

}  // namespace dpe::models
