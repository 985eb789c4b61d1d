// The FMA peak, measured (Note [FMA peak probe] in fma_peak.cc): every CPU's at once, the FMA-peak limit
// `dpe bench` holds its rows against, and one core's, what "% of peak" in bench/matmul_bench is relative to.
#pragma once

#include <string>
#include <vector>

namespace dpe {

struct FmaPeak {
  std::string isa;  // "AVX2" or "AVX-512": the vector width the figure was measured with
  double gflops = 0;  // float32 GFLOP/s of one core
};

// One figure per vector ISA dpe runs here (AVX2 always: dpe is built for x86-64-v3; AVX-512 where cpu_isa()
// has it, so DPE_MAX_CPU_ISA=avx2 measures the limit of the paths it leaves), narrowest first. Takes ~1 s per
// ISA.
std::vector<FmaPeak> probe_fma_peaks();

// The largest of `peaks` (not empty): the core's peak, with the ISA that reaches it.
FmaPeak widest(const std::vector<FmaPeak>& peaks);

struct MachinePeak {
  std::string isa;         // the vector ISA of the larger sum
  double gflops = 0;       // float32 GFLOP/s of every CPU together
  std::vector<int> cpus;   // the CPUs probed: this process's affinity mask
  std::vector<double> per_cpu;  // each one's share of `gflops`, in `cpus` order
};

// Every CPU this process may run on, probed at the same time (Note [Every CPU at once] in fma_peak.cc), for
// each ISA; the larger sum. What the machine can do at once, which one core's peak times the cores is not
// where cores share FMA units or clock down together. Takes ~0.3 s per ISA.
MachinePeak probe_fma_peak_every_cpu();

}  // namespace dpe
