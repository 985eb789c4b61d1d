#include "core/fma_peak.h"

#include <immintrin.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <thread>

#include "core/cpu_cores.h"
#include "core/cpu_isa.h"

namespace dpe {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Note [FMA peak probe]
// Peak = FMA instructions per second on one core x lanes x 2 flops, measured by kAccumulators independent
// FMA chains (enough to cover FMA latency x pipes on current x86 cores), so the loop is bound by FMA
// throughput alone. It is a probe of the core, not a GEMM.
// dpe is compiled for x86-64-v3 (AVX2), so each probe carries its own target attribute and the AVX-512 one
// runs only where cpu_isa() has it (the CPU, under DPE_MAX_CPU_ISA): the figure is for the widest vectors dpe
// runs, which is what oneDNN's JIT kernels and OpenBLAS's SkylakeX/Cooperlake kernels use. (Zen 4 runs
// 512-bit FMAs at half rate, Zen 5 at full rate: the probe tells which.)
// noinline: inlined into probe_fma_peaks, GCC 12 stored the 12 AVX2 accumulators to the stack on every
// iteration, and the probe measured half the AVX2 peak.
constexpr int kAccumulators = 12;

__attribute__((target("avx2,fma"), noinline)) double fma_gflops_avx2(int64_t iterations) {
  __m256 acc[kAccumulators];
  for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm256_set1_ps(1.0f + j * 1e-3f);
  const __m256 mul = _mm256_set1_ps(0.9999999f), add = _mm256_set1_ps(1e-7f);
  const auto start = Clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm256_fmadd_ps(acc[j], mul, add);
  }
  const double t = seconds_since(start);
  __m256 sum = acc[0];
  for (int j = 1; j < kAccumulators; ++j) sum = _mm256_add_ps(sum, acc[j]);
  volatile float sink = _mm256_cvtss_f32(sum);
  (void)sink;
  return iterations * kAccumulators * 8.0 * 2.0 / t * 1e-9;
}

__attribute__((target("avx512f"), noinline)) double fma_gflops_avx512(int64_t iterations) {
  __m512 acc[kAccumulators];
  for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm512_set1_ps(1.0f + j * 1e-3f);
  const __m512 mul = _mm512_set1_ps(0.9999999f), add = _mm512_set1_ps(1e-7f);
  const auto start = Clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm512_fmadd_ps(acc[j], mul, add);
  }
  const double t = seconds_since(start);
  __m512 sum = acc[0];
  for (int j = 1; j < kAccumulators; ++j) sum = _mm512_add_ps(sum, acc[j]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);  // (_mm512_reduce_add_ps trips -Wuninitialized in GCC 12's header)
  volatile float sink = lanes[0];
  (void)sink;
  return iterations * kAccumulators * 16.0 * 2.0 / t * 1e-9;
}

constexpr int kRuns = 10;
constexpr int64_t kIterations = 20'000'000;

// Best of 10 runs of ~30 ms each (the first also warms the clock up): the best, because anything else
// running on the core only ever lowers the figure (with 5 runs, a busy machine gave 199 instead of 259).
double best_of(double (*probe)(int64_t)) {
  double best = 0;
  for (int r = 0; r < kRuns; ++r) best = std::max(best, probe(kIterations));
  return best;
}

// Note [Every CPU at once]
// The machine's peak is not one core's times the cores wherever cores share something: two hardware threads
// of one core share its FMA units, and many CPUs run wide vectors at a lower clock when every core does.
// So every CPU of the affinity mask runs the probe at the same time, a pinned thread each, in kRuns rounds
// started together (a barrier); the best round's sum is the peak. On the 2-vCPU Zen 5 VMs both CPUs
// measure what one does alone (266-269 GFLOP/s each), so there the two figures agree.
std::vector<double> best_round_together(double (*probe)(int64_t), const std::vector<int>& cpus) {
  const size_t n = cpus.size();
  std::vector<std::vector<double>> rounds(kRuns, std::vector<double>(n));
  std::barrier start(static_cast<std::ptrdiff_t>(n));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      // Unpinned (a mask that refuses it), the thread still runs, and the round measures what it got.
      (void)pin_this_thread({cpus[i]});
      for (int r = 0; r < kRuns; ++r) {
        start.arrive_and_wait();
        rounds[r][i] = probe(kIterations);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  auto sum = [](const std::vector<double>& v) {
    double total = 0;
    for (double x : v) total += x;
    return total;
  };
  return *std::max_element(rounds.begin(), rounds.end(),
                           [&](const auto& a, const auto& b) { return sum(a) < sum(b); });
}

}  // namespace

std::vector<FmaPeak> probe_fma_peaks() {
  std::vector<FmaPeak> peaks = {{"AVX2", best_of(fma_gflops_avx2)}};
  if (cpu_isa() >= CpuIsa::Avx512) peaks.push_back({"AVX-512", best_of(fma_gflops_avx512)});
  return peaks;
}

MachinePeak probe_fma_peak_every_cpu() {
  const std::vector<int> cpus = usable_cpus();  // this thread's affinity mask
  MachinePeak best;
  auto consider = [&](const char* isa, double (*probe)(int64_t)) {
    MachinePeak m{.isa = isa, .cpus = cpus, .per_cpu = best_round_together(probe, cpus)};
    for (double g : m.per_cpu) m.gflops += g;
    if (m.gflops > best.gflops) best = std::move(m);
  };
  consider("AVX2", fma_gflops_avx2);
  if (cpu_isa() >= CpuIsa::Avx512) consider("AVX-512", fma_gflops_avx512);
  return best;
}

FmaPeak widest(const std::vector<FmaPeak>& peaks) {
  return *std::max_element(peaks.begin(), peaks.end(),
                           [](const FmaPeak& x, const FmaPeak& y) { return x.gflops < y.gflops; });
}

}  // namespace dpe
