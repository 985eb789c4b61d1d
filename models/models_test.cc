#include "models/models.h"

#include <gtest/gtest.h>

#include "core/ops.h"
#include "layers/llama.h"
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
  EXPECT_EQ(parameter_count(*llama), 492928);
  Tensor tokens = Tensor::from_vector(std::vector<int64_t>(2 * kTinyLlamaSeqLen, 65), {2, kTinyLlamaSeqLen});
  EXPECT_EQ(llama->forward(tokens).shape(), (Shape{2, kTinyLlamaSeqLen, 259}));
}

// tiny-llama is the "tiny" preset of layers/llama.h, with the sequence length the tool trains at, and the same
// weights for the same seed.
TEST(ModelsTest, TinyLlamaIsTheTinyPreset) {
  nn::LlamaConfig c = nn::llama_preset("tiny");
  EXPECT_EQ(c.max_seq_len, kTinyLlamaSeqLen);
  EXPECT_EQ(c.vocab_size, 259);
  manual_seed(5);
  auto made = make_model("tiny-llama");
  manual_seed(5);
  nn::Llama direct(c);
  nn::StateDict a = made->state_dict(), b = direct.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(max_abs_diff(a[i].second, b[i].second), 0.0) << a[i].first;
  }
  EXPECT_EQ(nn::llama_size(c).num_params, parameter_count(*made));
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

// Validating a name must not draw random numbers: `dpe train --resume` restores the generators from the
// checkpoint and then asks for the loss; a name check that built a model (as model_loss once did) moved
// cpu:0's generator and made the resumed run differ from the uninterrupted one.
TEST(ModelsTest, NameChecksAndLossesDrawNoRandomNumbers) {
  manual_seed(3);
  std::vector<Device> devices = all_devices(DeviceKind::CPU);
  if (cuda_available()) {
    for (const Device& d : all_devices(DeviceKind::CUDA)) devices.push_back(d);
  }
  randn({5});  // a generator that has moved: offsets are not all 0
  std::vector<uint64_t> before;
  for (const Device& d : devices) before.push_back(default_generator(d).offset());
  for (const std::string& name : kModelNames) {
    check_model_name(name);
    model_loss(name);
    train_flops_per_sample(name);
  }
  testing::error_of([] { check_model_name("resnet"); });
  testing::error_of([] { model_loss("resnet"); });
  for (size_t i = 0; i < devices.size(); ++i) {
    EXPECT_EQ(default_generator(devices[i]).offset(), before[i]) << devices[i];
  }
  // The test can fail: building a model does move cpu:0's generator.
  make_model("mlp");
  EXPECT_NE(default_generator(Device::cpu(0)).offset(), before[0]);
}

TEST(ModelsTest, UnknownNamesAreErrorsNamingTheKnownOnes) {
  for (auto f : {+[] { check_model_name("resnet"); }, +[] { model_loss("resnet"); },
                 +[] { train_flops_per_sample("resnet"); }, +[] { check_model_name(""); }}) {
    std::string e = testing::error_of(f);
    EXPECT_NE(e.find("unknown model '"), std::string::npos) << e;
    EXPECT_NE(e.find("expected mlp, cnn or tiny-llama"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace dpe::models
