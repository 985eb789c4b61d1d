#include "core/peak_flops.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "core/error.h"

namespace dpe {
namespace {

TEST(PeakFlops, TheTableKnowsEachGpuByItsCudaName) {
  EXPECT_EQ(gpu_peak_tflops("NVIDIA H100 80GB HBM3", ComputePrecision::BF16), 989.4);
  EXPECT_EQ(gpu_peak_tflops("NVIDIA H100 80GB HBM3", ComputePrecision::TF32), 494.7);
  EXPECT_EQ(gpu_peak_tflops("NVIDIA H100 80GB HBM3", ComputePrecision::FP32), 66.9);
  EXPECT_EQ(gpu_peak_tflops("NVIDIA H200", ComputePrecision::BF16), 989.4);
  // The more specific names win over the family's.
  EXPECT_EQ(gpu_peak_tflops("NVIDIA H100 PCIe", ComputePrecision::BF16), 756.5);
  EXPECT_EQ(gpu_peak_tflops("NVIDIA H100 NVL", ComputePrecision::BF16), 835.5);
  EXPECT_EQ(gpu_peak_tflops("NVIDIA H200 NVL", ComputePrecision::FP32), 60.0);
  EXPECT_EQ(gpu_peak_tflops("NVIDIA A100-SXM4-80GB", ComputePrecision::BF16), 312.0);
  EXPECT_FALSE(gpu_peak_tflops("NVIDIA GeForce RTX 4090", ComputePrecision::BF16).has_value());
}

TEST(PeakFlops, AnOverrideWinsAndABadOneIsRefused) {
  ASSERT_EQ(setenv("DPE_PEAK_GFLOPS", "250", 1), 0);
  const std::optional<PeakFlops> peak = peak_flops({Device::cpu(0)}, ComputePrecision::FP32, 2);
  ASSERT_TRUE(peak.has_value());
  EXPECT_EQ(peak->gflops, 250.0);  // the user's figure is the whole machine's: not multiplied
  EXPECT_NE(peak->source.find("DPE_PEAK_GFLOPS"), std::string::npos) << peak->source;
  ASSERT_EQ(setenv("DPE_PEAK_GFLOPS", "-3", 1), 0);
  EXPECT_THROW(peak_gflops_override(), Error);
  ASSERT_EQ(unsetenv("DPE_PEAK_GFLOPS"), 0);
  EXPECT_FALSE(peak_gflops_override().has_value());
}

TEST(PeakFlops, CpuDevicesShareTheMachinesProbedPeak) {
  const std::optional<PeakFlops> one = peak_flops({Device::cpu(0)}, ComputePrecision::FP32);
  ASSERT_TRUE(one.has_value());
  EXPECT_GT(one->gflops, 0);
  EXPECT_NE(one->source.find("FMA probe"), std::string::npos) << one->source;
  const std::optional<PeakFlops> three = peak_flops({Device::cpu(0)}, ComputePrecision::FP32, 3);
  ASSERT_TRUE(three.has_value());
  // Another probe: within 2x of three times the first (the probe is noisy, not that noisy).
  EXPECT_GT(three->gflops, 1.5 * one->gflops);
  EXPECT_LT(three->gflops, 6.0 * one->gflops);
}

}  // namespace
}  // namespace dpe
