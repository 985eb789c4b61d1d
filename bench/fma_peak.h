// The FMA peak of one core, measured (Note [FMA peak probe] in fma_peak.cc): what "% of peak" in
// bench/matmul_bench and the FMA-peak limit of `dpe bench` are relative to.
#pragma once

#include <string>
#include <vector>

namespace dpe::bench {

struct FmaPeak {
  std::string isa;  // "AVX2" or "AVX-512": the vector width the figure was measured with
  double gflops = 0;  // float32 GFLOP/s of one core
};

// One figure per vector ISA this CPU runs (AVX2 always: dpe is built for x86-64-v3; AVX-512 where
// __builtin_cpu_supports("avx512f") says so), narrowest first. Takes ~1 s per ISA.
std::vector<FmaPeak> probe_fma_peaks();

// The largest of `peaks` (not empty): the core's peak, with the ISA that reaches it.
FmaPeak widest(const std::vector<FmaPeak>& peaks);

}  // namespace dpe::bench
