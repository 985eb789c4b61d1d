// Times the memory-bound kernels of the CNN's training step (models/models.cc: conv32 - pool - conv64 + BN -
// pool - fc128 - fc10) on the shapes one CPU device sees in `dpe bench --model cnn --batch-size 128` on two
// devices (64 samples each), on one thread as a device worker runs them, and prints each kernel's time and
// the bytes it moves per second. These kernels are what a bfloat16 step spends most of its time in once AMX
// runs the convolutions (docs/BENCHMARKS.md); one far below the memcpy rate printed first has room to go.
// Last, the second convolution's backward as two calls and as one (dy reordered for oneDNN once), and the first
// convolution with its ReLU and pool, fused and composed.
//
// Usage: bazel run --config=cpu_only //bench:cnn_kernels_bench [-- --min_seconds=0.3]
#include <omp.h>
#include <tbb/task_arena.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/best_time.h"
#include "core/dtype.h"
#include "core/kernels/conv.h"
#include "core/kernels/conv_pool.h"
#include "core/kernels/copy.h"
#include "core/kernels/elementwise.h"
#include "core/kernels/layout.h"
#include "core/kernels/pool.h"
#include "core/kernels/reduce.h"

namespace {

using dpe::bench::best_ms;
namespace k = dpe::kernels;

// bytes: what the kernel reads and writes at least; 0 for a compute-bound kernel (no rate printed).
void report(const std::string& name, double ms, double bytes) {
  if (bytes > 0) {
    std::printf("%-44s %8.3f ms %7.1f GB/s\n", name.c_str(), ms, bytes / ms * 1e-6);
  } else {
    std::printf("%-44s %8.3f ms\n", name.c_str(), ms);
  }
}

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

k::Layout flat(const int64_t& n) { return k::contiguous_layout(1, &n); }

void bench_max_pool(double min_seconds, int64_t n, int64_t c, int64_t hw) {
  k::Pool2dShape s;
  s.planes = n * c;
  s.h = s.w = hw;
  s.h_out = s.w_out = hw / 2;
  s.kh = s.kw = s.stride_h = s.stride_w = 2;
  const int64_t in = s.planes * hw * hw, out = s.planes * s.h_out * s.w_out;
  std::vector<float> x = random_floats(in, 1), y(out), dy = random_floats(out, 2), dx(in);
  std::vector<int64_t> indices(out);
  const std::string shape =
      std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(hw) + "x" + std::to_string(hw);
  report("max_pool2d 2x2 forward " + shape,
         best_ms(min_seconds, [&] { k::max_pool2d_cpu(s, x.data(), y.data(), indices.data()); }),
         4.0 * in + 12.0 * out);
  report("max_pool2d 2x2 backward " + shape,
         best_ms(min_seconds, [&] { k::max_pool2d_backward_cpu(s, dy.data(), indices.data(), dx.data()); }),
         12.0 * out + 4.0 * in);
  // What max_pool2d runs: window codes instead of indices (Note [Window codes]).
  std::vector<uint8_t> codes(out);
  report("max_pool2d 2x2 forward, window codes " + shape,
         best_ms(min_seconds, [&] { k::max_pool2d_2x2_cpu(s, x.data(), y.data(), codes.data()); }),
         4.0 * in + 5.0 * out);
  report("max_pool2d 2x2 backward, window codes " + shape,
         best_ms(min_seconds, [&] { k::max_pool2d_2x2_backward_cpu(s, dy.data(), codes.data(), dx.data()); }),
         5.0 * out + 4.0 * in);
}

void bench_relu(double min_seconds, int64_t numel, const std::string& what) {
  std::vector<float> x = random_floats(numel, 3), y(numel), dy = random_floats(numel, 4), dx(numel);
  report("relu forward " + what,
         best_ms(min_seconds, [&] { k::unary_cpu(k::UnaryOp::Relu, dpe::DType::Float32, numel, x.data(), y.data()); }),
         8.0 * numel);
  report("relu backward " + what,
         best_ms(min_seconds,
                 [&] {
                   k::activation_backward_cpu(k::ActivationOp::Relu, dpe::DType::Float32, numel, x.data(), dy.data(),
                                              dx.data());
                 }),
         12.0 * numel);
}

// autocast's cast of a float32 activation (or its gradient) to bfloat16 for a
// convolution.
void bench_cast(double min_seconds, int64_t numel, const std::string& what) {
  std::vector<float> x = random_floats(numel, 5);
  std::vector<dpe::BFloat16> y(static_cast<size_t>(numel));
  const k::Layout layout = flat(numel);
  report("cast float32 -> bfloat16 " + what,
         best_ms(min_seconds,
                 [&] { k::copy_cpu(x.data(), dpe::DType::Float32, layout, y.data(), dpe::DType::BFloat16, layout); }),
         6.0 * numel);
}

// A convolution's bias gradient, dy summed over (N, H, W) per channel, as
// sum(dy, {0, 2, 3}) reduces it: each H x W plane, then the planes of a
// channel.
void bench_bias_grad(double min_seconds, int64_t n, int64_t c, int64_t hw) {
  const int64_t numel = n * c * hw * hw;
  std::vector<float> dy = random_floats(numel, 6), by_plane(n * c), db(c);
  const std::string shape =
      std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(hw) + "x" + std::to_string(hw);
  report("bias gradient sum(dy, {0, 2, 3}) " + shape,
         best_ms(min_seconds,
                 [&] {
                   k::reduce_cpu(k::AxisReduction::Sum, dpe::DType::Float32, n * c, hw * hw, 1, dy.data(),
                                 by_plane.data());
                   k::reduce_cpu(k::AxisReduction::Sum, dpe::DType::Float32, 1, n, c, by_plane.data(), db.data());
                 }),
         4.0 * numel);
}

// The CNN's second convolution's backward (32 -> 64 channels, 3x3, padding 1, 14 x 14), both gradients: as two
// calls, each reordering dy into oneDNN's layout, and as conv2d_backward_cpu's one call, which reorders it once.
void bench_conv_backward(double min_seconds, dpe::DType dtype) {
  k::Conv2dShape s;
  s.dtype = dtype;
  s.n = 64;
  s.c_in = 32;
  s.h = s.w = 14;
  s.c_out = 64;
  s.kh = s.kw = 3;
  s.pad_h = s.pad_w = 1;
  const int64_t x_numel = s.n * s.c_in * s.h * s.w, w_numel = s.c_out * s.c_in * 9, dy_numel = s.n * s.c_out * 196;
  const size_t bytes = dtype == dpe::DType::BFloat16 ? 2 : 4;
  auto operand = [&](int64_t numel, uint32_t seed) {
    std::vector<float> f = random_floats(numel, seed);
    std::vector<char> out(static_cast<size_t>(numel) * bytes);
    const k::Layout layout = flat(numel);
    k::copy_cpu(f.data(), dpe::DType::Float32, layout, out.data(), dtype, layout);
    return out;
  };
  std::vector<char> x = operand(x_numel, 8), w = operand(w_numel, 9), dy = operand(dy_numel, 10);
  std::vector<float> dx(x_numel), dw(w_numel);  // float32 outputs in both dtypes
  const std::string name = dtype == dpe::DType::BFloat16 ? " bfloat16" : " float32";
  report("conv2 backward, two calls" + name, best_ms(min_seconds, [&] {
           k::conv2d_backward_data_cpu(s, dy.data(), w.data(), dx.data());
           k::conv2d_backward_weight_cpu(s, x.data(), dy.data(), dw.data());
         }),
         0);
  report("conv2 backward, one call" + name, best_ms(min_seconds, [&] {
           k::conv2d_backward_cpu(s, x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr);
         }),
         0);
}

// The CNN's first convolution: 1 -> 32 channels, 3x3, padding 1, on n 28 x 28 images.
k::Conv2dShape conv1_shape(int64_t n, bool channels_last) {
  k::Conv2dShape s;
  s.n = n;
  s.c_in = 1;
  s.h = s.w = 28;
  s.c_out = 32;
  s.kh = s.kw = 3;
  s.pad_h = s.pad_w = 1;
  s.channels_last = channels_last;
  return s;
}

// The CNN's first convolution's weight gradient (1 -> 32 channels, 3x3, padding 1, 28 x 28; its input needs no
// gradient), NCHW and channels last, with its GFLOP/s: a reduction over N * H * W = 100,352 positions into 32 x 9
// weights.
void bench_conv1_backward_weight(double min_seconds, int64_t n, bool channels_last) {
  const k::Conv2dShape s = conv1_shape(n, channels_last);
  std::vector<float> x = random_floats(s.n * 784, 11), dy = random_floats(s.n * 32 * 784, 12), dw(32 * 9), db(32);
  const double ms = best_ms(min_seconds, [&] {
    k::conv2d_backward_cpu(s, x.data(), nullptr, dy.data(), nullptr, dw.data(), db.data());
  });
  const double flops = 2.0 * static_cast<double>(s.n) * 784 * 32 * 9;
  std::printf("%-44s %8.3f ms %7.1f GFLOP/s\n",
              ("conv1 backward weights+bias " + std::to_string(n) + (channels_last ? "x28x28x1 (cl)" : "x1x28x28")).c_str(),
              ms, flops / ms * 1e-6);
}

// The CNN's first layer, Conv2d(1, 32, 3, padding 1) -> ReLU -> MaxPool2d(2) on 28 x 28, both ways: in one pass
// each way (conv2d_relu_max_pool2d_cpu, core/kernels/conv_pool.h) and composed (oneDNN's convolution and the 2x2
// window-code pool; backward: the pool's gradient, then the weight and bias gradients), with the fused pass's
// GFLOP/s (its backward multiplies one window candidate in four: a quarter of the composition's products).
void bench_conv1_relu_pool(double min_seconds, int64_t n, bool channels_last) {
  const k::Conv2dShape s = conv1_shape(n, channels_last);
  k::Pool2dShape p;
  p.planes = n * 32;
  p.h = p.w = 28;
  p.h_out = p.w_out = 14;
  p.kh = p.kw = p.stride_h = p.stride_w = 2;
  p.channels_last = channels_last;
  p.c = 32;
  p.relu = true;
  std::vector<float> x = random_floats(n * 784, 13), w = random_floats(32 * 9, 14), b = random_floats(32, 15);
  std::vector<float> y(n * 32 * 196), dy = random_floats(n * 32 * 196, 16), dw(32 * 9), db(32);
  std::vector<float> conv(n * 32 * 784), dconv(n * 32 * 784);
  std::vector<uint8_t> codes(n * 32 * 196);
  const std::string shape = std::to_string(n) + (channels_last ? "x28x28x1 (cl)" : "x1x28x28");
  const double flops = 2.0 * static_cast<double>(n) * 784 * 32 * 9;
  const double fused_fwd = best_ms(min_seconds, [&] {
    k::conv2d_relu_max_pool2d_cpu(s, x.data(), w.data(), b.data(), y.data(), codes.data());
  });
  const double fused_bwd = best_ms(min_seconds, [&] {
    k::conv2d_relu_max_pool2d_backward_cpu(s, x.data(), dy.data(), codes.data(), dw.data(), db.data());
  });
  const double composed_fwd = best_ms(min_seconds, [&] {
    k::conv2d_forward_cpu(s, x.data(), w.data(), b.data(), conv.data());
    k::max_pool2d_2x2_cpu(p, conv.data(), y.data(), codes.data());
  });
  const double composed_bwd = best_ms(min_seconds, [&] {
    k::max_pool2d_2x2_backward_cpu(p, dy.data(), codes.data(), dconv.data());
    k::conv2d_backward_cpu(s, x.data(), nullptr, dconv.data(), nullptr, dw.data(), db.data());
  });
  std::printf("%-44s %8.3f ms %7.1f GFLOP/s\n", ("conv1+relu+pool fused forward " + shape).c_str(), fused_fwd,
              flops / fused_fwd * 1e-6);
  std::printf("%-44s %8.3f ms %7.1f GFLOP/s\n", ("conv1+relu+pool fused backward " + shape).c_str(), fused_bwd,
              flops / 4 / fused_bwd * 1e-6);
  std::printf("%-44s %8.3f ms\n", ("conv1+relu+pool composed forward " + shape).c_str(), composed_fwd);
  std::printf("%-44s %8.3f ms\n", ("conv1+relu+pool composed backward " + shape).c_str(), composed_bwd);
}

void bench_copy_rate(double min_seconds) {
  const int64_t numel = int64_t{1} << 22;
  std::vector<float> x = random_floats(numel, 7), y(numel);
  report("reference: memcpy 16 MiB",
         best_ms(min_seconds, [&] { std::memcpy(y.data(), x.data(), numel * sizeof(float)); }), 8.0 * numel);
}

}  // namespace

int main(int argc, char** argv) {
  double min_seconds = 0.2;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--min_seconds=", 0) == 0) {
      min_seconds = std::atof(arg.c_str() + 14);
    } else {
      std::fprintf(stderr, "unknown argument '%s'; expected --min_seconds=S\n", arg.c_str());
      return 2;
    }
  }
  omp_set_num_threads(1);
  tbb::task_arena one_core(1);
  one_core.execute([&] {
    bench_copy_rate(min_seconds);
    bench_max_pool(min_seconds, 64, 32, 28);
    bench_max_pool(min_seconds, 64, 64, 14);
    bench_relu(min_seconds, 64 * 32 * 14 * 14, "64x32x14x14");
    bench_relu(min_seconds, 64 * 64 * 7 * 7, "64x64x7x7");
    bench_cast(min_seconds, 64 * 32 * 14 * 14, "64x32x14x14 (conv2's input)");
    bench_cast(min_seconds, 64 * 64 * 14 * 14, "64x64x14x14 (conv2's dy)");
    bench_cast(min_seconds, 64 * 32 * 28 * 28, "64x32x28x28 (conv1's dy)");
    bench_bias_grad(min_seconds, 64, 32, 28);
    bench_bias_grad(min_seconds, 64, 64, 14);
    bench_conv_backward(min_seconds, dpe::DType::Float32);
    bench_conv_backward(min_seconds, dpe::DType::BFloat16);
    bench_conv1_backward_weight(min_seconds, 128, false);
    bench_conv1_backward_weight(min_seconds, 128, true);
    bench_conv1_relu_pool(min_seconds, 64, false);
    bench_conv1_relu_pool(min_seconds, 64, true);
  });
  return 0;
}
