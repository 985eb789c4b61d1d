// The tensor layer on CUDA: copies between every pair of device kinds, ops against their CPU results,
// autograd across devices. Every test skips (reported as skipped) without a GPU.
#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/stream.h"

namespace dpe {
namespace {

class TensorCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

Tensor sample(const Shape& shape, uint64_t seed, DType dtype = DType::Float32) {
  Generator gen(seed);
  return randn(shape, TensorOptions(dtype), &gen);
}

TEST_F(TensorCudaTest, HostDeviceRoundTripsForEveryDType) {
  Tensor host = arange(200).reshape({10, 20});  // 0..199 is exact in every dtype, uint8 included
  for (DType t : kAllDTypes) {
    Tensor back = host.to(t).to(Device::cuda(0)).to(Device::cpu(0)).to(DType::Float32);
    EXPECT_TRUE(equal(back, host)) << t;
  }
  // Strided and cast copies land correctly on the device.
  Tensor t = host.t();
  EXPECT_TRUE(equal(t.to(Device::cuda(0)).to(Device::cpu(0)), t.contiguous()));
  Tensor on_gpu = zeros({20, 10}, TensorOptions(DType::Float64).with_device(Device::cuda(0)));
  on_gpu.copy_(t);
  EXPECT_TRUE(equal(on_gpu.to(Device::cpu(0)).to(DType::Float32), t.contiguous()));
}

TEST_F(TensorCudaTest, SameSeedSameNumbersOnCpuAndCuda) {
  Generator a(5), b(5);
  Tensor cpu = rand({4097}, TensorOptions(DType::Float32), &a);
  Tensor gpu = rand({4097}, TensorOptions(DType::Float32).with_device(Device::cuda(0)), &b);
  EXPECT_TRUE(equal(cpu, gpu.to(Device::cpu(0))));
  Generator c(9), d(9);
  Tensor ncpu = randn({4097}, TensorOptions(DType::Float64), &c);
  Tensor ngpu = randn({4097}, TensorOptions(DType::Float64).with_device(Device::cuda(0)), &d);
  EXPECT_LT(max_abs_diff(ncpu, ngpu.to(Device::cpu(0))), 1e-12);  // libm vs CUDA log/cos: ~1 ulp
}

TEST_F(TensorCudaTest, OpsMatchCpu) {
  Device g = Device::cuda(0);
  Tensor a = sample({37, 53}, 1), b = sample({53, 29}, 2), row = sample({53}, 3);
  // Tolerances: float32 GEMM with k = 53 (different summation order in cuBLAS): 1e-4 relative; the rest
  // are elementwise or short reductions, a few ulps.
  EXPECT_TRUE(allclose(matmul(a.to(g), b.to(g)).to(Device::cpu(0)), matmul(a, b), 1e-4, 1e-5));
  EXPECT_TRUE(allclose(matmul(b.t().to(g), a.t().to(g)).to(Device::cpu(0)), matmul(b.t(), a.t()), 1e-4, 1e-5));
  EXPECT_TRUE(allclose((a.to(g) * row.to(g) + 1.0).to(Device::cpu(0)), a * row + 1.0, 1e-6, 1e-6));
  EXPECT_TRUE(allclose(gelu(a.to(g)).to(Device::cpu(0)), gelu(a), 1e-5, 1e-6));
  EXPECT_TRUE(allclose(log_softmax(a.to(g), 1).to(Device::cpu(0)), log_softmax(a, 1), 1e-5, 1e-5));
  EXPECT_TRUE(allclose(sum(a.to(g), 0).to(Device::cpu(0)), sum(a, 0), 1e-5, 1e-5));
  EXPECT_TRUE(equal(argmax(a.to(g), 1).to(Device::cpu(0)), argmax(a, 1)));
  EXPECT_TRUE(allclose(cat({a.to(g), a.to(g)}, 1).to(Device::cpu(0)), cat({a, a}, 1), 0, 0));
}

TEST_F(TensorCudaTest, BackwardOnCudaMatchesCpu) {
  Device g = Device::cuda(0);
  Tensor w_cpu = sample({8, 4}, 4, DType::Float64).set_requires_grad(true);
  Tensor w_gpu = w_cpu.detach().to(g).set_requires_grad(true);
  Tensor x = sample({16, 8}, 5, DType::Float64);
  sum(tanh(matmul(x, w_cpu))).backward();
  sum(tanh(matmul(x.to(g), w_gpu))).backward();
  EXPECT_EQ(w_gpu.grad().device(), g);
  EXPECT_TRUE(allclose(w_gpu.grad().to(Device::cpu(0)), w_cpu.grad(), 1e-12, 1e-12));
}

// silu_mul (SwiGLU's gating) is one kernel each way on both backends: on CUDA the numbers of the CUDA
// composition mul(silu(gate), up) exactly, forward and backward, and the CPU's to float32's rounding.
TEST_F(TensorCudaTest, FusedSiluMulIsTheCompositionOnCuda) {
  Device g = Device::cuda(0);
  Tensor gate = sample({37, 53}, 6), up = sample({37, 53}, 7), dy = sample({37, 53}, 8);
  Tensor gc = gate.detach().set_requires_grad(true), uc = up.detach().set_requires_grad(true);
  Tensor gg = gate.to(g).set_requires_grad(true), ug = up.to(g).set_requires_grad(true);
  Tensor gr = gate.to(g).set_requires_grad(true), ur = up.to(g).set_requires_grad(true);
  Tensor yc = silu_mul(gc, uc), yg = silu_mul(gg, ug), yr = mul(silu(gr), ur);
  EXPECT_TRUE(equal(yg, yr));
  EXPECT_TRUE(allclose(yg.to(Device::cpu(0)), yc, 1e-5, 1e-6));
  yc.backward(dy);
  yg.backward(dy.to(g));
  yr.backward(dy.to(g));
  EXPECT_TRUE(equal(gg.grad(), gr.grad()));
  EXPECT_TRUE(equal(ug.grad(), ur.grad()));
  EXPECT_TRUE(allclose(gg.grad().to(Device::cpu(0)), gc.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(allclose(ug.grad().to(Device::cpu(0)), uc.grad(), 1e-5, 1e-6));
}

TEST_F(TensorCudaTest, GradientsFlowAcrossDevices) {
  Tensor w = sample({4}, 6, DType::Float64).set_requires_grad(true);  // on cpu:0
  Tensor y = sum(square(w.to(Device::cuda(0))));
  y.backward();
  EXPECT_EQ(w.grad().device(), Device::cpu(0));
  EXPECT_TRUE(allclose(w.grad(), w.detach() * 2.0, 1e-15, 0));
}

TEST_F(TensorCudaTest, PerDeviceMemoryStats) {
  Device g = Device::cuda(0);
  int64_t before = memory_stats(g).allocated_bytes;
  Tensor t = Tensor::empty({1 << 20}, TensorOptions(g));
  EXPECT_EQ(memory_stats(g).allocated_bytes - before, 4 << 20);
  EXPECT_GE(memory_stats(g).peak_allocated_bytes, before + (4 << 20));
}

TEST_F(TensorCudaTest, EventsTimeDeviceWork) {
  Device g = Device::cuda(0);
  Event start, stop;
  start.record(g);
  Tensor a = sample({512, 512}, 7).to(g);
  Tensor c = matmul(a, a);
  stop.record(g);
  stop.synchronize();
  EXPECT_GE(start.elapsed_ms(stop), 0.0);
  synchronize(g);
}

}  // namespace
}  // namespace dpe
