// DPE_MAX_CPU_ISA where oneDNN was used before dpe (an embedding application's own first oneDNN call): oneDNN
// has fixed its instruction set and no cap can lower it, so dpe refuses to run above the cap rather than run
// silently uncapped (Note [The CPU instruction-set cap], core/cpu_isa.h). core/BUILD sets DPE_MAX_CPU_ISA=avx2.
#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/cpu_isa.h"
#include "core/ops.h"
#include "tests/testing/errors.h"

namespace dpe {
namespace {

TEST(OneDnnIsaCapTest, RefusesWhenOneDnnRanFirstAboveTheCap) {
  ASSERT_EQ(cpu_isa_cap(), CpuIsa::Avx2) << "core/BUILD runs this test with DPE_MAX_CPU_ISA=avx2";
  dnnl::get_effective_cpu_isa();  // the application's first oneDNN call: oneDNN fixes the CPU's own ISA
  const Tensor a = randn({8, 8});
  if (native_cpu_isa() == CpuIsa::Avx2) {
    EXPECT_NO_THROW(matmul(a, a)) << "oneDNN at the cap already: nothing to refuse";
    GTEST_SKIP() << "this CPU has no AVX-512: oneDNN's own ISA is the cap's";
  }
  const std::string error = testing::error_of([&] { matmul(a, a); });
  EXPECT_NE(error.find("DPE_MAX_CPU_ISA=avx2 cannot cap oneDNN: it was used before dpe and fixed its instruction "
                       "set at avx512_core"),
            std::string::npos)
      << error;
  // Refused again on the next call, not run uncapped.
  EXPECT_NE(testing::error_of([&] { matmul(a, a); }).find("cannot cap oneDNN"), std::string::npos);
}

}  // namespace
}  // namespace dpe
