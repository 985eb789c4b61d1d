// The instruction-set cap (Note [The CPU instruction-set cap], core/cpu_isa.h): its parser, and that this
// process's dpe paths, oneDNN and CPU autocast follow DPE_MAX_CPU_ISA as set for it. The cap is read once per
// process, so each cap is a run of this binary: core/BUILD runs it uncapped and under every cap
// (cpu_isa_test_isa_avx2, cpu_isa_test_isa_avx512).
#include "core/cpu_isa.h"

#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdlib>

#include "core/amp/autocast.h"
#include "core/kernels/matmul.h"
#include "core/ops.h"
#include "tests/testing/errors.h"

namespace dpe {
namespace {

using testing::error_of;

// The cap as this test reads DPE_MAX_CPU_ISA itself.
std::optional<CpuIsa> cap_from_env() {
  const char* env = std::getenv("DPE_MAX_CPU_ISA");
  const std::string text = env != nullptr ? env : "";
  if (text == "avx2") return CpuIsa::Avx2;
  if (text == "avx512") return CpuIsa::Avx512;
  if (text == "avx512_bf16") return CpuIsa::Avx512Bf16;
  return std::nullopt;
}

TEST(CpuIsaTest, ParsesTheCapsNames) {
  EXPECT_EQ(parse_cpu_isa_cap("avx2"), CpuIsa::Avx2);
  EXPECT_EQ(parse_cpu_isa_cap("avx512"), CpuIsa::Avx512);
  EXPECT_EQ(parse_cpu_isa_cap("avx512_bf16"), CpuIsa::Avx512Bf16);
  EXPECT_EQ(parse_cpu_isa_cap("native"), std::nullopt);
  EXPECT_EQ(parse_cpu_isa_cap(""), std::nullopt);
  for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16}) {
    EXPECT_EQ(parse_cpu_isa_cap(cpu_isa_name(isa)), isa);
  }
}

TEST(CpuIsaTest, RefusesOtherNamesNamingTheChoices) {
  for (const char* bad : {"AVX2", "avx512bf16", "sse4", "avx2 ", "amx"}) {
    const std::string want =
        std::string("DPE_MAX_CPU_ISA='") + bad + "': expected avx2, avx512, avx512_bf16 or native (unset: native)";
    EXPECT_EQ(error_of([&] { parse_cpu_isa_cap(bad); }).rfind(want, 0), 0u) << bad;
  }
}

TEST(CpuIsaTest, TheCapLowersAndNeverRaises) {
  EXPECT_EQ(cpu_isa_cap(), cap_from_env());
  EXPECT_EQ(cpu_isa(), std::min(native_cpu_isa(), cap_from_env().value_or(CpuIsa::Avx512Bf16)));
  EXPECT_LE(cpu_isa(), native_cpu_isa());
  std::printf("native %s, DPE_MAX_CPU_ISA %s: dpe runs %s\n", std::string(cpu_isa_name(native_cpu_isa())).c_str(),
              cpu_isa_cap() ? std::string(cpu_isa_name(*cpu_isa_cap())).c_str() : "unset",
              std::string(cpu_isa_name(cpu_isa())).c_str());
}

// oneDNN runs at or below the cap once dpe has called it; under a cap below the CPU's, exactly at the cap.
TEST(CpuIsaTest, OneDnnFollowsTheCap) {
  (void)matmul(randn({8, 8}), randn({8, 8}));  // dpe's first oneDNN call applies the cap
  const auto effective = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto mask = [](CpuIsa isa) {
    switch (isa) {
      case CpuIsa::Avx2: return static_cast<unsigned>(dnnl::cpu_isa::avx2);
      case CpuIsa::Avx512: return static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
      case CpuIsa::Avx512Bf16: return static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    }
    return 0u;
  };
  if (std::getenv("ONEDNN_MAX_CPU_ISA") != nullptr && !cpu_isa_cap()) {
    GTEST_SKIP() << "ONEDNN_MAX_CPU_ISA is set without DPE_MAX_CPU_ISA: oneDNN follows its own variable";
  }
  if (cpu_isa_cap()) {
    EXPECT_EQ(effective & ~mask(*cpu_isa_cap()), 0u) << "oneDNN runs above DPE_MAX_CPU_ISA";
    if (*cpu_isa_cap() < native_cpu_isa()) EXPECT_EQ(effective, mask(*cpu_isa_cap()));
  } else {
    EXPECT_EQ(effective & mask(native_cpu_isa()), mask(native_cpu_isa())) << "oneDNN runs below the CPU's ISA";
  }
}

// CPU autocast computes in bfloat16 exactly where dpe's ISA multiplies bfloat16 natively.
TEST(CpuIsaTest, AutocastFollowsTheCap) {
  if (std::getenv("ONEDNN_MAX_CPU_ISA") != nullptr) GTEST_SKIP() << "ONEDNN_MAX_CPU_ISA is set: it decides too";
  EXPECT_EQ(kernels::cpu_has_bf16_instructions(), cpu_isa() == CpuIsa::Avx512Bf16);
  amp::AutocastGuard autocast(DeviceKind::CPU);
  EXPECT_EQ(amp::autocast_state().cpu.has_value(), cpu_isa() == CpuIsa::Avx512Bf16);
}

}  // namespace
}  // namespace dpe
