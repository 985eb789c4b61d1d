// The built-in models of `dpe train` / `dpe bench`, the examples and the PyTorch reference script
// (tools/bench/pytorch_reference.py builds the same layers in the same order):
//   mlp         Fashion-MNIST: Flatten, Linear(784, 512), ReLU, Linear(512, 512), ReLU, Linear(512, 10)
//   cnn         Fashion-MNIST: Conv2d(1, 32, 3, pad 1), ReLU, MaxPool2d(2), Conv2d(32, 64, 3, pad 1),
//               BatchNorm2d(64), ReLU, MaxPool2d(2), Flatten, Linear(3136, 128), ReLU, Linear(128, 10)
//   tiny-llama  byte-level language model (data/text_corpus.h): nn::Llama of layers/llama.h's "tiny" preset,
//               vocab 259, dim 128, 2 layers, 4 heads, hidden 384, sequences of 64 tokens; the loss ignores padding.
// mlp and cnn are nn::Sequential, so convert_sync_batchnorm applies to them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/loss.h"
#include "layers/module.h"

namespace dpe::models {

inline const std::vector<std::string> kModelNames = {"mlp", "cnn", "tiny-llama"};
inline constexpr int64_t kTinyLlamaSeqLen = 64;

// Throws naming the unknown model and the known ones; builds nothing and draws no random numbers, so it
// may run anywhere, e.g. after a resumed checkpoint restored the generators (an exact resume needs them
// untouched).
void check_model_name(const std::string& name);
// Throws like check_model_name. Parameters on cpu:0 (move with module->to(device)); the initial weights
// consume the default generator of cpu:0.
std::shared_ptr<nn::Module> make_model(const std::string& name);
// Cross-entropy for the classifiers; for tiny-llama, over every position, padding ignored. Validates the
// name with check_model_name: no random numbers are drawn.
LossFn model_loss(const std::string& name);
// Multiply-add FLOPs (2 per multiply-add) of forward + backward for one sample: the matrix products and
// convolutions only (3x forward; the first layer's input gradient is not needed and not counted).
double train_flops_per_sample(const std::string& name);

}  // namespace dpe::models
