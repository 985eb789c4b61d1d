#include "models/models.h"

#include <gtest/gtest.h>

#include "core/ops.h"
#include "layers/sync_batchnorm.h"
#include "tests/testing/errors.h"

namespace dpe::models {
namespace {

int64_t parameter_count(const nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

TEST(ModelsTest, ShapesAndParameterCountsMatchThePyTorchReference) {
  // Counts printed by tools/bench/pytorch_reference.py for the same layers.
  Tensor images = randn({3, 1, 28, 28});
  auto mlp = make_model("mlp");
  EXPECT_EQ(parameter_count(*mlp), 669706);
  EXPECT_EQ(mlp->forward(images).shape(), (Shape{3, 10}));
  auto cnn = make_model("cnn");
  EXPECT_EQ(parameter_count(*cnn), 421770);
  EXPECT_EQ(cnn->forward(images).shape(), (Shape{3, 10}));
  auto llama = make_model("tiny-llama");
  Tensor tokens = Tensor::from_vector(std::vector<int64_t>(2 * kTinyLlamaSeqLen, 65), {2, kTinyLlamaSeqLen});
  EXPECT_EQ(llama->forward(tokens).shape(), (Shape{2, kTinyLlamaSeqLen, 259}));
}

TEST(ModelsTest, LossesAndFlops) {
  Tensor logits = randn({4, 10});
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 9}, {4});
  EXPECT_GT(model_loss("cnn")(logits, labels).item(), 0);
  // The language-model loss ignores padding (258): all-padding targets give 0/0, like PyTorch.
  Tensor lm_logits = randn({1, 3, 259});
  Tensor some_pad = Tensor::from_vector(std::vector<int64_t>{5, 258, 258}, {1, 3});
  Tensor first_only = Tensor::from_vector(std::vector<int64_t>{5}, {1});
  EXPECT_NEAR(model_loss("tiny-llama")(lm_logits, some_pad).item(),
              model_loss("mlp")(lm_logits.narrow(1, 0, 1).reshape({1, 259}), first_only).item(), 1e-5);
  EXPECT_NEAR(train_flops_per_sample("mlp"), 2 * 2 * 784 * 512 + 3 * 2 * (512 * 512 + 5120), 1);
  EXPECT_GT(train_flops_per_sample("cnn"), train_flops_per_sample("mlp"));
}

TEST(ModelsTest, CnnConvertsToSyncBatchNormAndUnknownNamesAreErrors) {
  auto cnn = nn::convert_sync_batchnorm(make_model("cnn"));
  int found = nn::set_sync_batchnorm_group(*cnn, nullptr, 0);
  EXPECT_EQ(found, 1);
  std::string e = testing::error_of([] { make_model("resnet"); });
  EXPECT_NE(e.find("unknown model 'resnet'; expected mlp, cnn or tiny-llama"), std::string::npos) << e;
}

}  // namespace
}  // namespace dpe::models
