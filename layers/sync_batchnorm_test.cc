#include "layers/sync_batchnorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <thread>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"
#include "layers/activation.h"
#include "layers/containers.h"
#include "layers/conv.h"
#include "tests/testing/devices.h"
#include "tests/testing/errors.h"
#include "tests/testing/golden.h"
#include "tests/testing/gradcheck.h"

namespace dpe::nn {
namespace {

using testing::error_of;
using testing::max_relative_error;

// Runs fn(rank) for every member on its own thread (DDP's shape); rethrows the first member's error.
template <typename F>
void run_members(int n, F&& fn) {
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// One replica of `prototype` per device, each set to its member of `group`.
std::vector<std::shared_ptr<SyncBatchNorm>> replicas(const SyncBatchNorm& prototype,
                                                     const std::shared_ptr<ProcessGroup>& group) {
  std::vector<std::shared_ptr<SyncBatchNorm>> out;
  for (int r = 0; r < group->size(); ++r) {
    out.push_back(clone_module(prototype, group->devices()[r]));
    out.back()->set_process_group(group, r);
  }
  return out;
}

ProcessGroupOptions short_timeout() {
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(20);  // a broken test fails instead of hanging for minutes
  return options;
}

Tensor rows(const Tensor& t, int64_t start, int64_t length) { return t.narrow(0, start, length); }

// docs/PYTORCH_SEMANTICS.md §3's test vector.
TEST(SyncBatchNormTest, WorkedExampleFromTheReference) {
  auto group = std::make_shared<ProcessGroup>(testing::cpu_devices(2), short_timeout());
  SyncBatchNorm prototype(1, /*eps=*/0.0, /*momentum=*/0.1);
  auto members = replicas(prototype, group);
  const std::vector<Tensor> x = {Tensor::from_vector(std::vector<float>{1, 2}, {2, 1}, Device::cpu(0)),
                                 Tensor::from_vector(std::vector<float>{3, 4, 5, 6}, {4, 1}, Device::cpu(1))};
  std::vector<Tensor> y(2);
  run_members(2, [&](int r) { y[r] = members[r]->forward(x[r]); });

  // Merged: mean 3.5, var_n 17.5, biased var 17.5/6, unbiased 3.5.
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(members[r]->running_mean.item(), 0.35, 1e-6);
    EXPECT_NEAR(members[r]->running_var.item(), 1.25, 1e-6);
    EXPECT_EQ(members[r]->num_batches_tracked.item(), 1.0);
  }
  EXPECT_NEAR(y[0].to_vector<float>()[0], (1 - 3.5) / std::sqrt(17.5 / 6), 1e-6);
  // Each member's output is its rows of one BatchNorm over all six values.
  BatchNorm1d reference(1, 0.0, 0.1);
  Tensor y_ref = reference.forward(Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {6, 1}));
  EXPECT_LT(max_abs_diff(y[0], rows(y_ref, 0, 2)), 1e-6);
  EXPECT_LT(max_abs_diff(y[1].to(Device::cpu(0)), rows(y_ref, 2, 4)), 1e-6);
  EXPECT_NEAR(reference.running_var.item(), 1.25, 1e-6);
  EXPECT_EQ(group->calls(Collective::AllGather), 1);  // one per forward, nothing else
  EXPECT_EQ(group->total_calls(), 1);
}

// k members on uneven batches = one BatchNorm2d on the concatenated batch: outputs, dx, running stats, and
// the sum over members of the (local) weight/bias gradients.
void check_matches_single_device(const std::vector<Device>& devices, const std::vector<int64_t>& batch_sizes,
                                 DType dtype, double tol) {
  const int k = static_cast<int>(batch_sizes.size());
  ASSERT_EQ(devices.size(), batch_sizes.size());
  SCOPED_TRACE(std::to_string(k) + " members on " + devices[0].str() + "..., " +
               (dtype == DType::Float32 ? "float32" : "float64"));
  const int64_t C = 3, H = 2, W = 3;
  int64_t total = 0;
  for (int64_t n : batch_sizes) total += n;
  manual_seed(11);
  Tensor x_full = randn({total, C, H, W}).to(dtype) * 2.0 + 0.5;
  Tensor g_full = randn({total, C, H, W}).to(dtype);

  BatchNorm2d reference(C, 1e-5, 0.2);
  reference.to(dtype);
  SyncBatchNorm prototype(C, 1e-5, 0.2);
  prototype.to(dtype);
  {
    NoGradGuard no_grad;
    Tensor w = randn({C}).to(dtype), b = randn({C}).to(dtype);
    reference.weight.copy_(w);
    reference.bias.copy_(b);
    prototype.weight.copy_(w);
    prototype.bias.copy_(b);
  }
  Tensor x_ref = x_full.clone().set_requires_grad(true);
  Tensor y_ref = reference.forward(x_ref);
  sum(mul(y_ref, g_full)).backward();

  auto group = std::make_shared<ProcessGroup>(devices, short_timeout());
  auto members = replicas(prototype, group);
  std::vector<Tensor> x(k), y(k);
  std::vector<int64_t> offset(k, 0);
  for (int r = 1; r < k; ++r) offset[r] = offset[r - 1] + batch_sizes[r - 1];
  run_members(k, [&](int r) {
    const Device d = group->devices()[r];
    x[r] = rows(x_full, offset[r], batch_sizes[r]).to(d).clone().set_requires_grad(true);
    y[r] = members[r]->forward(x[r]);
    sum(mul(y[r], rows(g_full, offset[r], batch_sizes[r]).to(d))).backward();
  });

  Tensor grad_weight = zeros({C}, dtype), grad_bias = zeros({C}, dtype);
  for (int r = 0; r < k; ++r) {
    SCOPED_TRACE("member " + std::to_string(r));
    const Device cpu0 = Device::cpu(0);
    EXPECT_LT(max_abs_diff(y[r].to(cpu0), rows(y_ref, offset[r], batch_sizes[r])), tol);
    EXPECT_LT(max_abs_diff(x[r].grad().to(cpu0), rows(x_ref.grad(), offset[r], batch_sizes[r])), tol);
    EXPECT_LT(max_abs_diff(members[r]->running_mean.to(cpu0), reference.running_mean), tol);
    EXPECT_LT(max_abs_diff(members[r]->running_var.to(cpu0), reference.running_var), tol);
    EXPECT_EQ(members[r]->num_batches_tracked.item(), 1.0);
    grad_weight = add(grad_weight, members[r]->weight.grad().to(cpu0));
    grad_bias = add(grad_bias, members[r]->bias.grad().to(cpu0));
  }
  EXPECT_LT(max_abs_diff(grad_weight, reference.weight.grad()), tol * 10);  // sums of ~40 products
  EXPECT_LT(max_abs_diff(grad_bias, reference.bias.grad()), tol * 10);
  // Exactly one all_gather per forward and one all_reduce per backward.
  EXPECT_EQ(group->calls(Collective::AllGather), 1);
  EXPECT_EQ(group->calls(Collective::AllReduce), 1);
  EXPECT_EQ(group->total_calls(), 2);
}

TEST(SyncBatchNormTest, UnevenBatchesMatchOneDeviceOnTheWholeBatch) {
  // float32: the merge of per-member statistics and the single-device reduction round differently.
  check_matches_single_device(testing::cpu_devices(2), {3, 5}, DType::Float32, 1e-5);
  check_matches_single_device(testing::cpu_devices(3), {4, 1, 2}, DType::Float32, 1e-5);
  // float64: only summation order differs.
  check_matches_single_device(testing::cpu_devices(2), {3, 5}, DType::Float64, 1e-12);
  check_matches_single_device(testing::cpu_devices(3), {4, 1, 2}, DType::Float64, 1e-12);
}

TEST(SyncBatchNormTest, MemberWithAnEmptyBatchStillTakesPart) {
  check_matches_single_device(testing::cpu_devices(3), {3, 0, 2}, DType::Float64, 1e-12);
}

// Two logical CUDA devices on GPU 0 (the peer-copy backend) against the CPU reference.
TEST(SyncBatchNormTest, CudaMembersMatchOneCpuDevice) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  static const bool mapped = [] {
    set_cuda_logical_devices({0, 0});  // before any CUDA use in this binary
    return true;
  }();
  (void)mapped;
  const std::vector<Device> devices{Device::cuda(0), Device::cuda(1)};
  // float32: CUDA and CPU reductions sum in different orders (a few ulps of O(1) values, times ~10).
  check_matches_single_device(devices, {3, 5}, DType::Float32, 1e-4);
  check_matches_single_device(devices, {4, 2}, DType::Float64, 1e-10);
}

TEST(SyncBatchNormTest, WeightOnlyGradientNeedsNoAllReduce) {
  // x does not need a gradient: grad_weight/grad_bias are local, so the backward issues no collective.
  auto group = std::make_shared<ProcessGroup>(testing::cpu_devices(2), short_timeout());
  auto members = replicas(SyncBatchNorm(2), group);
  run_members(2, [&](int r) {
    Tensor x = randn({4, 2, 3}, group->devices()[r]);
    sum(square(members[r]->forward(x))).backward();
  });
  EXPECT_TRUE(members[0]->weight.grad().defined());
  EXPECT_EQ(group->calls(Collective::AllGather), 1);
  EXPECT_EQ(group->calls(Collective::AllReduce), 0);
}

TEST(SyncBatchNormTest, GradcheckWithoutAGroupAndWithAGroupOfOne) {
  auto group = std::make_shared<ProcessGroup>(testing::cpu_devices(1));
  for (bool with_group : {false, true}) {
    SCOPED_TRACE(with_group ? "group of one" : "no group");
    SyncBatchNorm bn(2);
    bn.to(DType::Float64);
    if (with_group) bn.set_process_group(group, 0);
    {
      NoGradGuard no_grad;
      bn.weight.copy_(Tensor::from_vector(std::vector<double>{0.5, -1.5}, {2}));
      bn.bias.copy_(Tensor::from_vector(std::vector<double>{0.1, 0.2}, {2}));
    }
    Tensor x = testing::randn_leaf({3, 2, 2, 3}, 21);
    EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return bn.forward(in[0]); },
                                 {x, bn.weight, bn.bias}),
              "");
    Tensor x3 = testing::randn_leaf({4, 2}, 22);  // any rank >= 2
    EXPECT_EQ(testing::gradcheck([&](const std::vector<Tensor>& in) { return bn.forward(in[0]); },
                                 {x3, bn.weight, bn.bias}),
              "");
  }
  EXPECT_EQ(group->total_calls(), 0);
}

// Without synchronisation SyncBatchNorm is BatchNorm2d, bit for bit.
void expect_identical(SyncBatchNorm& sync, BatchNorm2d& bn, const Tensor& x_in) {
  Tensor xa = x_in.clone().set_requires_grad(true), xb = x_in.clone().set_requires_grad(true);
  Tensor ya = sync.forward(xa), yb = bn.forward(xb);
  EXPECT_TRUE(equal(ya, yb));
  Tensor g = randn(x_in.shape(), x_in.device());
  sum(mul(ya, g)).backward();
  sum(mul(yb, g)).backward();
  EXPECT_TRUE(equal(xa.grad(), xb.grad()));
  EXPECT_TRUE(equal(sync.weight.grad(), bn.weight.grad()));
  EXPECT_TRUE(equal(sync.bias.grad(), bn.bias.grad()));
  EXPECT_TRUE(equal(sync.running_mean, bn.running_mean));
  EXPECT_TRUE(equal(sync.running_var, bn.running_var));
  EXPECT_TRUE(equal(sync.num_batches_tracked, bn.num_batches_tracked));
}

TEST(SyncBatchNormTest, EvalOrNoGroupIsBatchNormAndIssuesNoCollective) {
  manual_seed(5);
  // No group, training and eval.
  SyncBatchNorm sync(3);
  BatchNorm2d bn(3);
  expect_identical(sync, bn, randn({4, 3, 2, 2}));
  sync.eval();
  bn.eval();
  expect_identical(sync, bn, randn({2, 3, 2, 2}));

  // A group of two, eval: running stats, no communication (each member may run alone).
  auto group = std::make_shared<ProcessGroup>(testing::cpu_devices(2), short_timeout());
  sync.train();
  auto members = replicas(sync, group);
  auto bn_copy = clone_module(bn, Device::cpu(1));
  members[1]->eval();
  bn_copy->eval();
  expect_identical(*members[1], *bn_copy, randn({3, 3, 2, 2}, Device::cpu(1)));
  // A group of one, training.
  auto solo = std::make_shared<ProcessGroup>(std::vector<Device>{Device::cpu(0)});
  SyncBatchNorm sync_solo(3);
  sync_solo.set_process_group(solo, 0);
  BatchNorm2d bn_solo(3);
  expect_identical(sync_solo, bn_solo, randn({4, 3, 2, 2}));
  EXPECT_EQ(group->total_calls(), 0);
  EXPECT_EQ(solo->total_calls(), 0);
}

TEST(SyncBatchNormTest, StateDictAndCloneLikeBatchNorm) {
  SyncBatchNorm sync(3);
  BatchNorm2d bn(3);
  std::vector<std::string> names_sync, names_bn;
  for (const auto& [name, t] : sync.state_dict()) names_sync.push_back(name);
  for (const auto& [name, t] : bn.state_dict()) names_bn.push_back(name);
  EXPECT_EQ(names_sync, names_bn);
  // A clone is a different member: it has no group until the engine gives it one.
  auto group = std::make_shared<ProcessGroup>(testing::cpu_devices(2));
  sync.set_process_group(group, 1);
  auto replica = clone_module(sync, Device::cpu(1));
  EXPECT_EQ(replica->process_group(), nullptr);
  EXPECT_EQ(replica->type_name(), "SyncBatchNorm");
  EXPECT_EQ(sync.process_group(), group);
  EXPECT_EQ(sync.rank(), 1);
  sync.set_process_group(nullptr, 0);
  EXPECT_EQ(sync.process_group(), nullptr);
}

// ---- convert_sync_batchnorm ----

std::shared_ptr<Sequential> small_model() {
  auto inner = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Flatten>(2), std::make_shared<BatchNorm1d>(4, 1e-3, 0.3)});
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(3, 4, 3, 1, 1), std::make_shared<BatchNorm2d>(4), std::make_shared<ReLU>(), inner});
}

TEST(SyncBatchNormTest, ConvertReplacesEveryBatchNormKeepingTheState) {
  manual_seed(8);
  auto model = small_model();
  for (int i = 0; i < 3; ++i) model->forward(randn({4, 3, 5, 5}));  // non-trivial running stats
  auto bn2 = std::dynamic_pointer_cast<BatchNorm2d>((*model)[1]);
  bn2->bias.set_requires_grad(false);  // a frozen parameter stays frozen
  model->eval();
  Tensor x = randn({2, 3, 5, 5});
  Tensor y_before = model->forward(x);
  const StateDict before = model->state_dict();
  const std::vector<Tensor> params_before = model->parameters();

  std::shared_ptr<Module> converted = convert_sync_batchnorm(model);
  EXPECT_EQ(converted, model);  // the root is not a BatchNorm: changed in place
  auto sync2 = std::dynamic_pointer_cast<SyncBatchNorm>((*model)[1]);
  auto inner = std::dynamic_pointer_cast<Sequential>((*model)[3]);
  ASSERT_NE(sync2, nullptr);
  ASSERT_NE(inner, nullptr);
  auto sync1 = std::dynamic_pointer_cast<SyncBatchNorm>((*inner)[1]);
  ASSERT_NE(sync1, nullptr);
  EXPECT_EQ((*model)[0]->type_name(), "Conv2d");
  EXPECT_EQ(sync1->options().eps, 1e-3);
  EXPECT_EQ(sync1->options().momentum, 0.3);
  EXPECT_FALSE(sync1->is_training());

  const StateDict after = model->state_dict();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].first, before[i].first);
    EXPECT_TRUE(equal(after[i].second, before[i].second)) << after[i].first;
    EXPECT_EQ(after[i].second.requires_grad(), before[i].second.requires_grad()) << after[i].first;
  }
  EXPECT_FALSE(sync2->bias.requires_grad());
  // The same parameter tensors (PyTorch's converter): handles held by an optimizer stay valid.
  const std::vector<Tensor> params_after = model->parameters();
  ASSERT_EQ(params_after.size(), params_before.size());
  for (size_t i = 0; i < params_after.size(); ++i) EXPECT_TRUE(params_after[i].is_same(params_before[i]));
  EXPECT_TRUE(equal(model->forward(x), y_before));

  // Replicas keep the type (containers clone child by child).
  auto replica = std::static_pointer_cast<Sequential>(model->clone(Device::cpu(0)));
  EXPECT_EQ((*replica)[1]->type_name(), "SyncBatchNorm");
  auto group = std::make_shared<ProcessGroup>(testing::cpu_devices(2));
  EXPECT_EQ(set_sync_batchnorm_group(*replica, group, 1), 2);
  EXPECT_EQ(std::static_pointer_cast<SyncBatchNorm>((*replica)[1])->rank(), 1);
}

TEST(SyncBatchNormTest, ConvertARootBatchNormAndAModuleList) {
  auto bn = std::make_shared<BatchNorm1d>(3, 1e-5, 0.1, /*affine=*/false);
  auto converted = std::dynamic_pointer_cast<SyncBatchNorm>(convert_sync_batchnorm(bn));
  ASSERT_NE(converted, nullptr);
  EXPECT_FALSE(converted->weight.defined());
  EXPECT_EQ(converted->state_dict().size(), 3u);

  auto list = std::make_shared<ModuleList>(std::vector<std::shared_ptr<Module>>{std::make_shared<BatchNorm2d>(2)});
  auto dict = std::make_shared<ModuleDict>();
  dict->insert("norms", list);
  convert_sync_batchnorm(dict);
  EXPECT_EQ((*list)[0]->type_name(), "SyncBatchNorm");
}

// A custom module reaches its BatchNorm through a typed member, and its clone() rebuilds it with reset().
class Block : public Cloneable<Block> {
 public:
  Block() : Cloneable("Block") { reset(); }
  void reset() override {
    features = register_module("features", std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
                                               std::make_shared<BatchNorm1d>(2)}));
    bn = register_module("bn", std::make_shared<BatchNorm1d>(2));
  }
  Tensor forward(const Tensor& x) override { return bn->forward(features->forward(x)); }
  std::shared_ptr<Sequential> features;
  std::shared_ptr<BatchNorm1d> bn;
};

TEST(SyncBatchNormTest, ConvertRefusesBatchNormUnderACustomModule) {
  auto model = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<BatchNorm1d>(2), std::make_shared<Block>()});
  const std::string error = error_of([&] { convert_sync_batchnorm(model); });
  EXPECT_NE(error.find("cannot replace '1.features.0' (BatchNorm1d): it lies under '1' (Block)"), std::string::npos)
      << error;
  // Nothing changed.
  EXPECT_EQ((*model)[0]->type_name(), "BatchNorm1d");
  EXPECT_NE(error_of([] { convert_sync_batchnorm(std::make_shared<Block>()); }).find("under the root (Block)"),
            std::string::npos);
}

// ---- errors ----

TEST(SyncBatchNormTest, Errors) {
  SyncBatchNorm bn(3);
  EXPECT_NE(error_of([&] { bn.forward(zeros({3})); }).find("SyncBatchNorm: expected at least 2D input (N, C, *), got 1D"),
            std::string::npos);
  const std::string mismatch = error_of([&] { bn.forward(zeros({2, 5, 4})); });
  EXPECT_NE(mismatch.find("SyncBatchNorm(3): expected 3 channels at dim 1, got input [2, 5, 4]"), std::string::npos)
      << mismatch;
  EXPECT_NE(error_of([] { SyncBatchNorm bad(0); }).find("num_features must be positive"), std::string::npos);

  auto group = std::make_shared<ProcessGroup>(testing::cpu_devices(2), short_timeout());
  EXPECT_NE(error_of([&] { bn.set_process_group(group, 2); })
                .find("SyncBatchNorm(3).set_process_group: rank 2 is out of range for a group of 2 members"),
            std::string::npos);
  EXPECT_NE(error_of([&] { bn.set_process_group(group, -1); }).find("rank -1 is out of range"), std::string::npos);

  // One member's bad input: it throws its own error and aborts the group, so its partner fails at once
  // instead of waiting in the all_gather until the timeout.
  auto members = replicas(SyncBatchNorm(3), group);
  std::vector<std::string> errors(2);
  run_members(2, [&](int r) {
    errors[r] = error_of([&] { members[r]->forward(zeros({2, r == 0 ? 3 : 4}, group->devices()[r])); });
  });
  EXPECT_NE(errors[1].find("expected 3 channels at dim 1, got input [2, 4]"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("SyncBatchNorm on member 1 failed"), std::string::npos) << errors[0];
  group->reset();

  // Training needs more than one value per channel over the whole group: an error on every member.
  run_members(2, [&](int r) {
    errors[r] = error_of([&] { members[r]->forward(zeros({r == 0 ? 1 : 0, 3}, group->devices()[r])); });
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("expected more than 1 value per channel when training, got 1 over the group's 2 members"),
              std::string::npos)
        << e;
  }
}

}  // namespace
}  // namespace dpe::nn
