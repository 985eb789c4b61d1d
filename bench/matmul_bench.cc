// Times gemm_cpu (float32) on square sizes and on the MLP's forward/backward shapes, single-threaded and
// with every hardware thread, against the FMA peak measured here with the widest vectors the CPU has
// (core/fma_peak.h): once with the measured per-shape choice (policy "auto", and what it chose) and once
// with each library forced; the "default" column names the library the default policy's rule ("onednn")
// runs the shape on (Note [float32 GEMM choice] in core/kernels/sgemm_cpu.cc). OpenBLAS follows
// OPENBLAS_CORETYPE, which oneDNN ignores; the header line says which kernel OpenBLAS loaded.
//
// Threads: oneDNN uses OpenMP with omp_get_max_threads() of the calling thread, so each configuration sets
// omp_set_num_threads(t) and openblas_set_num_threads(t), inside a tbb::task_arena(t) as the engine's CPU
// device workers will. (The forced OpenBLAS column on t > 1 threads uses OpenBLAS's own pool; "auto" only
// considers OpenBLAS for one-thread shares.)
//
// Buffers are 64-byte aligned, as core/allocator.cc allocates them.
//
// Usage: bazel run --config=cpu_only //bench:matmul_bench [-- --min_seconds=0.3]
#include <cblas.h>
#include <omp.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/fma_peak.h"
#include "core/kernels/matmul.h"
#include "core/kernels/sgemm_choice.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Shape {
  const char* name;
  int64_t m, n, k;
  dpe::kernels::Transpose ta, tb;
};

// n floats at `offset_bytes` past a 64-byte boundary.
class Buffer {
 public:
  Buffer(int64_t n, size_t offset_bytes)
      : raw_(static_cast<char*>(std::aligned_alloc(64, (n * sizeof(float) + offset_bytes + 63) / 64 * 64))),
        data_(reinterpret_cast<float*>(raw_ + offset_bytes)) {}
  ~Buffer() { std::free(raw_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* data() { return data_; }

 private:
  char* raw_;
  float* data_;
};

// What the measured choice picked for this shape on `threads` threads.
std::string chosen(const Shape& s, int threads) {
  for (const dpe::kernels::SgemmChoice& c : dpe::kernels::sgemm_choices()) {
    if (c.m == s.m && c.n == s.n && c.k == s.k && c.trans_a == s.ta && c.trans_b == s.tb && c.threads == threads) {
      return std::string(dpe::kernels::sgemm_backend_name(c.backend));
    }
  }
  return "?";  // not measured
}

// Median GFLOP/s over >= 5 samples of >= min_seconds / 5 each, after one warm-up call (oneDNN JIT).
// Under `policy` ("auto" measures its choice on the warm-up call).
double time_gemm(dpe::kernels::SgemmPolicy policy, const Shape& s, double min_seconds) {
  using dpe::kernels::Transpose;
  const int64_t a_cols = s.ta == Transpose::No ? s.k : s.m, a_rows = s.ta == Transpose::No ? s.m : s.k;
  const int64_t b_cols = s.tb == Transpose::No ? s.n : s.k, b_rows = s.tb == Transpose::No ? s.k : s.n;
  Buffer a(a_rows * a_cols, 0), b(b_rows * b_cols, 0), c(s.m * s.n, 0);
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int64_t i = 0; i < a_rows * a_cols; ++i) a.data()[i] = dist(gen);
  for (int64_t i = 0; i < b_rows * b_cols; ++i) b.data()[i] = dist(gen);
  dpe::kernels::GemmArgs g;
  g.dtype = dpe::DType::Float32;
  g.trans_a = s.ta, g.trans_b = s.tb;
  g.m = s.m, g.n = s.n, g.k = s.k;
  g.a = a.data(), g.lda = a_cols;
  g.b = b.data(), g.ldb = b_cols;
  g.c = c.data(), g.ldc = s.n;
  dpe::kernels::set_sgemm_policy(policy);
  auto call = [&] { dpe::kernels::gemm_cpu(g); };
  call();
  const double flops = 2.0 * s.m * s.n * s.k;
  std::vector<double> samples;
  const auto bench_start = Clock::now();
  while (samples.size() < 5 || seconds_since(bench_start) < min_seconds) {
    int64_t calls = 0;
    const auto start = Clock::now();
    do {
      call();
      ++calls;
    } while (seconds_since(start) < min_seconds / 5);
    samples.push_back(flops * calls / seconds_since(start) * 1e-9);
  }
  dpe::kernels::clear_sgemm_policy();
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using dpe::kernels::Transpose;
  double min_seconds = 0.5;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--min_seconds=", 14) == 0) min_seconds = std::atof(argv[i] + 14);
  }
  const int all_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  // Peak: one core's FMA throughput, with the widest vectors the CPU has (Note [FMA peak probe] in
  // core/fma_peak.cc).
  const std::vector<dpe::FmaPeak> peaks = dpe::probe_fma_peaks();
  std::printf("FMA peak probe, one core:");
  for (const dpe::FmaPeak& p : peaks) std::printf(" %s %.1f GFLOP/s", p.isa.c_str(), p.gflops);
  const dpe::FmaPeak widest = dpe::widest(peaks);
  const double peak = widest.gflops;
  // Every CPU at once (Note [Every CPU at once]): what t threads can do is t of its CPUs' shares.
  const dpe::MachinePeak machine = dpe::probe_fma_peak_every_cpu();
  const double per_cpu_together = machine.gflops / static_cast<double>(machine.cpus.size());
  std::printf("\n  -> single-core FP32 peak used below: %.1f GFLOP/s (%s); with %zu CPUs at once %.1f GFLOP/s (%s), "
              "%.1f per CPU for the %d-thread rows\n",
              peak, widest.isa.c_str(), machine.cpus.size(), machine.gflops, machine.isa.c_str(), per_cpu_together,
              all_threads);
  std::printf("OpenBLAS core: %s (OPENBLAS_CORETYPE=%s); oneDNN picks its own ISA\n\n", openblas_get_corename(),
              std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "unset");

  const Shape shapes[] = {
      {"square 256", 256, 256, 256, Transpose::No, Transpose::No},
      {"square 512", 512, 512, 512, Transpose::No, Transpose::No},
      {"square 1024", 1024, 1024, 1024, Transpose::No, Transpose::No},
      {"square 2048", 2048, 2048, 2048, Transpose::No, Transpose::No},
      // The products of the MLP's Linear layers at batch 256 as dpe makes them: nn::Linear stores W as
      // (out, in), like PyTorch, so y = x W^T, dW = dy^T x (contiguous (out, in)), dx = dy W.
      {"fc1 fwd  x@W^T   256x784 @ 784x512", 256, 512, 784, Transpose::No, Transpose::Yes},
      {"fc1 dW   dy^T@x  512x256 @ 256x784", 512, 784, 256, Transpose::Yes, Transpose::No},
      {"fc1 dx   dy@W    256x512 @ 512x784", 256, 784, 512, Transpose::No, Transpose::No},
      {"fc2 fwd  h@W^T   256x512 @ 512x512", 256, 512, 512, Transpose::No, Transpose::Yes},
      {"fc2 dW   dy^T@h  512x256 @ 256x512", 512, 512, 256, Transpose::Yes, Transpose::No},
      {"fc2 dx   dy@W    256x512 @ 512x512", 256, 512, 512, Transpose::No, Transpose::No},
      {"fc3 fwd  h@W^T   256x512 @ 512x10", 256, 10, 512, Transpose::No, Transpose::Yes},
      {"fc3 dW   dy^T@h  10x256 @ 256x512", 10, 512, 256, Transpose::Yes, Transpose::No},
      {"fc3 dx   dy@W    256x10 @ 10x512", 256, 512, 10, Transpose::No, Transpose::No},
      // tiny-llama at batch 8 (512 positions of width 128): a projection, then one head of its attention
      // (sequence 64, head size 32): scores q k^T, then p v.
      {"llama    x@W^T   512x128 @ 128x128", 512, 128, 128, Transpose::No, Transpose::Yes},
      {"attn     q@k^T   64x32 @ 32x64", 64, 64, 32, Transpose::No, Transpose::Yes},
      {"attn     p@v     64x64 @ 64x32", 64, 32, 64, Transpose::No, Transpose::No},
  };

  std::vector<int> thread_counts = {1};
  if (all_threads > 1) thread_counts.push_back(all_threads);
  using dpe::kernels::SgemmBackend;
  std::printf("GF/s (%% of the peak of that many CPUs); auto: the measured choice, then each library forced\n");
  std::printf("%-36s %7s %-14s %23s %16s %16s %16s\n", "shape (m x k @ k x n)", "threads", "default",
              "auto [choice]", "onednn-sgemm", "onednn-matmul", "openblas");
  for (int threads : thread_counts) {
    tbb::task_arena arena(threads);
    arena.execute([&] {
      omp_set_num_threads(threads);
      openblas_set_num_threads(threads);
      for (const Shape& s : shapes) {
        const double full = (threads == 1 ? peak : per_cpu_together * threads) / 100.0;
        const double automatic = time_gemm(dpe::kernels::SgemmPolicy::Auto, s, min_seconds);
        dpe::kernels::GemmArgs shape;
        shape.m = s.m, shape.n = s.n, shape.k = s.k, shape.trans_a = s.ta, shape.trans_b = s.tb;
        const std::string_view rule = dpe::kernels::sgemm_backend_name(dpe::kernels::onednn_rule(shape));
        std::printf("%-36s %7d %-14.*s %6.1f (%3.0f%%) %-13s", s.name, threads, static_cast<int>(rule.size()),
                    rule.data(), automatic, automatic / full, ("[" + chosen(s, threads) + "]").c_str());
        for (SgemmBackend b : dpe::kernels::kSgemmBackends) {
          const double gflops = time_gemm(dpe::kernels::forcing(b), s, min_seconds);
          std::printf(" %8.1f (%3.0f%%)", gflops, gflops / full);
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    });
  }
  std::printf("\nThe measured choices (core/kernels/sgemm_cpu.cc, Note [float32 GEMM choice]):\n");
  for (const dpe::kernels::SgemmChoice& c : dpe::kernels::sgemm_choices()) {
    std::printf("  %s\n", dpe::kernels::describe(c).c_str());
  }
  return 0;
}
