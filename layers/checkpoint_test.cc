// Activation checkpointing (layers/checkpoint.h): gradients bitwise those without it (dropout and BatchNorm
// included, and the Llama per block), the generators and buffers where the plain forward leaves them, hooks once
// per parameter even for one used inside and outside, less memory held between forward and backward, and the
// plain forward without grad mode.
#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/autograd/grad_mode.h"
#include "core/ops.h"
#include "layers/activation.h"
#include "layers/batchnorm.h"
#include "layers/checkpoint.h"
#include "layers/containers.h"
#include "layers/dropout.h"
#include "layers/linear.h"
#include "layers/llama.h"
#include "layers/loss.h"
#include "tests/testing/errors.h"

namespace dpe::nn {
namespace {

std::shared_ptr<Sequential> net() {
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(6, 32), std::make_shared<BatchNorm1d>(32), std::make_shared<ReLU>(),
      std::make_shared<Dropout>(0.3), std::make_shared<Linear>(32, 32), std::make_shared<Tanh>(),
      std::make_shared<Dropout>(0.2), std::make_shared<Linear>(32, 32), std::make_shared<ReLU>(),
      std::make_shared<Linear>(32, 3)});
}

struct Pass {
  std::vector<Tensor> grads, buffers;
  Tensor input_grad;
  uint64_t offset_after = 0;
};

// One forward and backward of `model` on a fresh input from seed 5.
Pass forward_backward(Module& model, const std::function<Tensor(const Tensor&)>& forward) {
  manual_seed(5);
  Tensor x = randn({16, 6}).set_requires_grad(true);
  Tensor y = randn({16, 3});
  functional::mse_loss(forward(x), y).backward();
  Pass pass;
  for (const Tensor& p : model.parameters()) pass.grads.push_back(p.grad());
  for (const Tensor& b : model.buffers()) pass.buffers.push_back(b.detach().clone());
  pass.input_grad = x.grad();
  pass.offset_after = default_generator(Device::cpu(0)).offset();
  return pass;
}

void expect_bitwise(const Pass& got, const Pass& want) {
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t k = 0; k < want.grads.size(); ++k) EXPECT_TRUE(equal(got.grads[k], want.grads[k])) << "parameter " << k;
  for (size_t k = 0; k < want.buffers.size(); ++k) EXPECT_TRUE(equal(got.buffers[k], want.buffers[k])) << "buffer " << k;
  EXPECT_TRUE(equal(got.input_grad, want.input_grad));
  EXPECT_EQ(got.offset_after, want.offset_after);  // the recomputation's draws are put back
}

TEST(Checkpoint, SequentialSegmentsGiveTheSameBitsWithDropoutAndBatchNorm) {
  manual_seed(1);
  auto plain = net();
  for (int64_t segments : {2, 3, 10}) {
    auto checkpointed = std::static_pointer_cast<Sequential>(plain->clone(Device::cpu(0)));
    auto reference = std::static_pointer_cast<Sequential>(plain->clone(Device::cpu(0)));
    checkpointed->set_checkpoint_segments(segments);
    EXPECT_EQ(std::static_pointer_cast<Sequential>(checkpointed->clone(Device::cpu(0)))->checkpoint_segments(), segments);
    const Pass want = forward_backward(*reference, [&](const Tensor& x) { return reference->forward(x); });
    const Pass got = forward_backward(*checkpointed, [&](const Tensor& x) { return checkpointed->forward(x); });
    expect_bitwise(got, want);
  }
}

TEST(Checkpoint, LlamaPerBlockGivesTheSameBitsWithAndWithoutPadding) {
  const LlamaConfig config{.vocab_size = 37, .dim = 32, .num_layers = 3, .num_heads = 4, .hidden_dim = 48,
                           .max_seq_len = 16, .num_kv_heads = 2};
  manual_seed(2);
  auto reference = std::make_shared<Llama>(config);
  auto checkpointed = std::static_pointer_cast<Llama>(reference->clone(Device::cpu(0)));
  checkpointed->set_activation_checkpointing(true);
  EXPECT_TRUE(std::static_pointer_cast<Llama>(checkpointed->clone(Device::cpu(0)))->activation_checkpointing());
  manual_seed(3);
  Tensor tokens = (rand({4, 16}) * 37.0).to(DType::Int64), targets = (rand({4, 16}) * 37.0).to(DType::Int64);
  Tensor mask = ones({4, 16}, TensorOptions(DType::Int64));
  mask.narrow(1, 12, 4).narrow(0, 1, 2).fill_(0);
  for (bool padded : {false, true}) {
    auto run = [&](Llama& model) {
      Tensor logits = padded ? model.forward(tokens, mask) : model.forward(tokens);
      functional::cross_entropy(logits.reshape({-1, 37}), targets.reshape({-1})).backward();
      std::vector<Tensor> grads;
      for (const Tensor& p : model.parameters()) {
        grads.push_back(p.grad().clone());
        p.set_grad(Tensor());
      }
      return grads;
    };
    const std::vector<Tensor> want = run(*reference), got = run(*checkpointed);
    for (size_t k = 0; k < want.size(); ++k) EXPECT_TRUE(equal(got[k], want[k])) << "padded " << padded << " parameter " << k;
  }
}

// A parameter used inside the checkpoint and outside it gets one gradient, accumulated once (its hook fires
// once), equal to the plain graph's.
TEST(Checkpoint, AParameterUsedInsideAndOutsideIsAccumulatedOnce) {
  manual_seed(4);
  auto layer = std::make_shared<Linear>(5, 5);
  Tensor x = randn({3, 5});
  auto loss_of = [&](bool checkpointed) {
    auto inner = [&](const std::vector<Tensor>& in) { return tanh(layer->forward(in[0])); };
    Tensor h = checkpointed ? checkpoint(*layer, inner, {x}) : inner({x});
    return sum(layer->forward(h));
  };
  int fired = 0;
  const int64_t hook = layer->weight.register_post_accumulate_grad_hook([&](const Tensor&) { ++fired; });
  loss_of(false).backward();
  const Tensor want = layer->weight.grad().clone();
  EXPECT_EQ(fired, 1);
  layer->weight.set_grad(Tensor());
  layer->bias.set_grad(Tensor());
  fired = 0;
  loss_of(true).backward();
  EXPECT_EQ(fired, 1);
  EXPECT_TRUE(equal(layer->weight.grad(), want));
  layer->weight.remove_post_accumulate_grad_hook(hook);
}

// Between forward and backward only the segments' inputs stay alive, not every layer's activations: 8 pairs of
// Linear and Tanh, each saving a (512, 256) tensor per layer; in 2 segments the first half keeps its input alone
// (the last segment runs plainly, as checkpoint_sequential's does), 9 tensors of the plain forward's 16.
TEST(Checkpoint, HoldsLessMemoryBetweenForwardAndBackward) {
  auto held_after_forward = [](int64_t segments) {
    manual_seed(6);
    auto model = std::make_shared<Sequential>();
    for (int i = 0; i < 8; ++i) {
      model->push_back(std::make_shared<Linear>(256, 256));
      model->push_back(std::make_shared<Tanh>());
    }
    model->set_checkpoint_segments(segments);
    Tensor x = randn({512, 256});
    const int64_t before = memory_stats(Device::cpu(0)).allocated_bytes;
    Tensor loss = sum(model->forward(x));
    const int64_t held = memory_stats(Device::cpu(0)).allocated_bytes - before;
    loss.backward();
    return held;
  };
  const int64_t plain = held_after_forward(0), checkpointed = held_after_forward(2);
  EXPECT_LT(checkpointed, plain * 2 / 3) << "plain " << plain << " B, checkpointed " << checkpointed << " B";
}

// The recomputation replays the generators of the checkpoint's own devices only: cpu:1's, drawn from between the
// forward and the backward (in DataParallel, by another replica's worker at the same time), is left alone.
TEST(Checkpoint, OtherDevicesGeneratorsAreLeftAlone) {
  auto layer = std::make_shared<Linear>(4, 4);  // on cpu:0
  std::vector<uint64_t> seen;                   // cpu:1's offset each time fn runs
  auto fn = [&](const std::vector<Tensor>& in) {
    seen.push_back(default_generator(Device::cpu(1)).offset());
    return layer->forward(in[0]);
  };
  Tensor out = checkpoint(*layer, fn, {randn({2, 4})});
  randn({1000}, TensorOptions().with_device(Device::cpu(1)));
  const uint64_t drawn = default_generator(Device::cpu(1)).offset();
  sum(out).backward();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], drawn);  // the recomputation saw cpu:1 as it was, not as it was at the forward
  EXPECT_EQ(default_generator(Device::cpu(1)).offset(), drawn);
}

TEST(Checkpoint, WithoutGradModeItIsThePlainForwardAndBadInputsAreRefused) {
  auto layer = std::make_shared<Linear>(4, 2);
  Tensor x = randn({3, 4});
  NoGradGuard no_grad;
  Tensor out = checkpoint(*layer, [&](const std::vector<Tensor>& in) { return layer->forward(in[0]); }, {x});
  EXPECT_FALSE(out.requires_grad());
  EXPECT_TRUE(equal(out, layer->forward(x)));
  EXPECT_NE(testing::error_of([&] { checkpoint(*layer, CheckpointFn(), {x}); }).find("checkpoint: no function"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { Sequential().set_checkpoint_segments(-1); }).find("-1 segments; expected >= 0"),
            std::string::npos);
}

}  // namespace
}  // namespace dpe::nn
