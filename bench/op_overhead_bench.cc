// The host time dpe spends per tensor op, apart from the kernel: each op runs on tiny tensors (the kernel's
// work is negligible) in a loop, and the loop's time per op is what the caller's thread pays to check the
// arguments, allocate the output, record the autograd node and launch. On a CUDA device the kernels queue up
// behind the host (they take a few microseconds each), so the loop's time is the host's; the device is
// synchronised once at the end, and the time printed includes that wait spread over the calls. A small
// model's GPU step is this overhead times its op count when it exceeds the kernels' time (docs/BENCHMARKS.md,
// "the CNN's step is host-bound").
//
// Usage: bazel run //bench:op_overhead_bench [-- --device=cuda:0 --calls=20000]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>

#include "core/autograd/grad_mode.h"
#include "core/device.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/conv.h"
#include "core/ops/norm.h"
#include "core/ops/pool.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace dpe;

// Microseconds per call of `op` over `calls` calls, after 100 unmeasured ones; the device synchronised
// before the clock starts and before it stops.
double us_per_call(const Device& device, int calls, const std::function<void()>& op) {
  for (int i = 0; i < 100; ++i) op();
  synchronize(device);
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < calls; ++i) op();
  synchronize(device);
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / calls;
}

int run(int argc, char** argv) {
  Device device = Device::cpu(0);
  int calls = 20000;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--device=")) {
      device = Device::parse(arg.substr(9));
    } else if (arg.starts_with("--calls=")) {
      calls = std::atoi(argv[i] + 8);
      DPE_CHECK(calls > 0, "--calls=", arg.substr(8), ": expected a positive number of calls");
    } else {
      DPE_CHECK(false, "unknown argument '", arg, "' (expected --device=D or --calls=N)");
    }
  }
  const TensorOptions options = TensorOptions(DType::Float32).with_device(device);
  Tensor a = ones({4, 4}, options), b = ones({4, 4}, options);
  Tensor w = ones({4, 4}, options).set_requires_grad(true);
  std::printf("# dpe op overhead on %s: host microseconds per call, %d calls, 4x4 float32 tensors\n",
              device.str().c_str(), calls);
  std::printf("%-44s %10s\n", "op", "us/call");
  auto row = [&](const char* name, const std::function<void()>& op) {
    std::printf("%-44s %10.2f\n", name, us_per_call(device, calls, op));
  };
  Tensor image = ones({1, 1, 4, 4}, options), filter = ones({1, 1, 3, 3}, options), channel = ones({1}, options);
  {
    NoGradGuard no_grad;
    // From the least an op does to the most: a synchronisation of an idle device, an allocation and its
    // release, an in-place kernel (no allocation), then ops that allocate their output.
    row("synchronize(device), idle", [&] { synchronize(device); });
    row("Tensor::empty({4, 4}), allocated and freed", [&] { (void)Tensor::empty({4, 4}, options); });
    row("a.add_(b), no grad", [&] { a.add_(b, 1e-9); });
    row("add(a, b), no grad", [&] { (void)add(a, b); });
    row("relu(a), no grad", [&] { (void)relu(a); });
    row("sum(a), no grad", [&] { (void)sum(a); });
    row("matmul(a, b), no grad", [&] { (void)matmul(a, b); });
    row("log_softmax(a, 1), no grad", [&] { (void)log_softmax(a, 1); });
    // The library calls behind a convolution (cuDNN on a GPU, oneDNN on CPU) and the fused batch norm.
    row("conv2d(1x1x4x4, 3x3), no grad", [&] { (void)conv2d(image, filter, channel, {1, 1}, {1, 1}); });
    row("batch_norm(1x1x4x4, training), no grad",
        [&] { (void)batch_norm(image, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5); });
    row("max_pool2d(1x1x4x4, 2), no grad", [&] { (void)max_pool2d(image, {2, 2}); });
  }
  row("add(a, w), recording the node", [&] { (void)add(a, w); });
  row("matmul(a, w), recording the node", [&] { (void)matmul(a, w); });
  // A convolution's three passes (on a GPU: cudnnConvolutionForward + cudnnAddTensor, then backward data,
  // backward filter and the bias gradient) and the autograd node between them.
  Tensor filter_w = ones({1, 1, 3, 3}, options).set_requires_grad(true);
  Tensor image_g = ones({1, 1, 4, 4}, options).set_requires_grad(true);
  Tensor bias_g = ones({1}, options).set_requires_grad(true);
  row("conv2d(1x1x4x4, 3x3).sum() and backward", [&] {
    Tensor loss = sum(conv2d(image_g, filter_w, bias_g, {1, 1}, {1, 1}));
    loss.backward();
    for (Tensor* t : {&image_g, &filter_w, &bias_g}) t->set_grad(Tensor());
  });
  // Forward and backward of a 4-op chain: 4 forward ops, 1 seed, their backward kernels, per call.
  row("relu(matmul(a, w) + b).sum() and backward", [&] {
    Tensor loss = sum(relu(add(matmul(a, w), b)));
    loss.backward();
    w.set_grad(Tensor());
  });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "op_overhead_bench: %s\n", e.what());
    return 1;
  }
}
