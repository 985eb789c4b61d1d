// Times the fused optimizer steps (core/kernels/optimizer.h) on one thread, as a CPU device's worker runs them,
// over as many float32 parameters as a replica of the 124M Llama holds, and prints each step's time and the
// bytes it moves per second beside an axpy's rate measured first (kernels::axpy_cpu, a pass of the same kind
// that computes nothing). The steps are memory-bound: one far below axpy's rate computes too slowly, as AdamW
// did while std::sqrt kept its loop scalar (core/BUILD's -fno-math-errno; about a fifth of axpy's rate then).
//
// Usage: bazel run --config=cpu_only //bench:optimizer_bench [-- --n=151898880 --min_seconds=1]
#include <omp.h>
#include <tbb/task_arena.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/best_time.h"
#include "core/dtype.h"
#include "core/kernels/elementwise.h"
#include "core/kernels/optimizer.h"

namespace {

using dpe::bench::best_ms;
namespace k = dpe::kernels;

// bytes: what the step reads and writes at least.
void report(const std::string& name, double ms, double bytes, double axpy_rate) {
  const double rate = bytes / ms * 1e-6;
  std::printf("%-40s %9.2f ms %7.1f GB/s", name.c_str(), ms, rate);
  if (axpy_rate > 0) std::printf("  %3.0f%% of axpy's", 100 * rate / axpy_rate);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 151898880;  // the 124M Llama preset's parameters (layers/llama.h)
  double min_seconds = 1.0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--n=", 0) == 0 && std::atoll(arg.c_str() + 4) > 0) {
      n = std::atoll(arg.c_str() + 4);
    } else if (arg.rfind("--min_seconds=", 0) == 0) {
      min_seconds = std::atof(arg.c_str() + 14);
    } else {
      std::fprintf(stderr, "unknown argument '%s'; expected --n=N (N > 0) and --min_seconds=S\n", arg.c_str());
      return 2;
    }
  }
  std::printf("%lld float32 parameters, one thread\n", static_cast<long long>(n));
  omp_set_num_threads(1);
  tbb::task_arena one_core(1);
  one_core.execute([&] {
    std::vector<float> param(static_cast<size_t>(n), 0.5f), grad(static_cast<size_t>(n), 0.01f);
    std::vector<float> exp_avg(static_cast<size_t>(n), 0.0f), exp_avg_sq(static_cast<size_t>(n), 0.0f);
    // The reference: a pass of the same kind (arrays read and one written back in place) that computes nothing.
    const double axpy_ms = best_ms(min_seconds, [&] {
      k::axpy_cpu(dpe::DType::Float32, n, 1e-3, grad.data(), exp_avg.data());
    });
    const double axpy_rate = 12.0 * static_cast<double>(n) / axpy_ms * 1e-6;
    report("axpy (m += a g)", axpy_ms, 12.0 * static_cast<double>(n), 0);

    k::SgdStep sgd{.lr = 0.01, .momentum = 0.9};
    report("SGD, momentum 0.9", best_ms(min_seconds, [&] {
             k::sgd_step_cpu(dpe::DType::Float32, n, param.data(), grad.data(), exp_avg.data(), sgd);
           }),
           20.0 * static_cast<double>(n), axpy_rate);  // reads p, g, buf; writes p, buf
    for (bool decoupled : {false, true}) {
      const k::AdamTensor tensor{n, param.data(), grad.data(), exp_avg.data(), exp_avg_sq.data()};
      k::AdamStep adam{.lr = 6e-4, .weight_decay = 0.1, .decoupled = decoupled, .step = 10};
      report(decoupled ? "AdamW, weight decay 0.1" : "Adam, weight decay 0.1",
             best_ms(min_seconds, [&] { k::adam_step_cpu(dpe::DType::Float32, {&tensor, 1}, adam); }),
             28.0 * static_cast<double>(n), axpy_rate);  // reads p, g, m, v; writes p, m, v
    }
  });
  return 0;
}
