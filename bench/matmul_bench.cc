// Times gemm_cpu (float32: oneDNN dnnl_sgemm) on square sizes and on the MLP's forward/backward shapes,
// single-threaded and with every hardware thread, and reports GFLOP/s as a percentage of the FMA peak
// measured here. OpenBLAS cblas_sgemm runs the same shapes for comparison (it is not what dpe uses for
// float32; it follows OPENBLAS_CORETYPE, which oneDNN ignores).
//
// Threads: dnnl_sgemm uses OpenMP with omp_get_max_threads() of the calling thread, so each
// configuration sets omp_set_num_threads(t) and openblas_set_num_threads(t), inside a tbb::task_arena(t)
// as the engine's CPU device workers will.
//
// Buffers are 64-byte aligned, as core/allocator.cc allocates them. A second gemm_cpu column moves B 16
// bytes off that alignment: oneDNN 2.6's sgemm picks a different (copy vs no-copy) path from B's
// alignment, and on some shapes the two differ by a third on Zen 3.
//
// Usage: bazel run //bench:matmul_bench [-- --min_seconds=0.3]
#include <cblas.h>
#include <omp.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/fma_peak.h"
#include "core/kernels/matmul.h"

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

enum class Library { Dpe, OpenBlas };

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

// Median GFLOP/s over >= 5 samples of >= min_seconds / 5 each, after one warm-up call (oneDNN JIT).
double time_gemm(Library lib, const Shape& s, double min_seconds, size_t b_offset_bytes = 0) {
  using dpe::kernels::Transpose;
  const int64_t a_cols = s.ta == Transpose::No ? s.k : s.m, a_rows = s.ta == Transpose::No ? s.m : s.k;
  const int64_t b_cols = s.tb == Transpose::No ? s.n : s.k, b_rows = s.tb == Transpose::No ? s.k : s.n;
  Buffer a(a_rows * a_cols, 0), b(b_rows * b_cols, b_offset_bytes), c(s.m * s.n, 0);
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
  auto call = [&] {
    if (lib == Library::Dpe) {
      dpe::kernels::gemm_cpu(g);
    } else {
      cblas_sgemm(CblasRowMajor, s.ta == Transpose::Yes ? CblasTrans : CblasNoTrans,
                  s.tb == Transpose::Yes ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, 1.0f, a.data(), a_cols,
                  b.data(), b_cols, 0.0f, c.data(), s.n);
    }
  };
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
  // bench/fma_peak.cc).
  const std::vector<dpe::bench::FmaPeak> peaks = dpe::bench::probe_fma_peaks();
  std::printf("FMA peak probe, one core:");
  for (const dpe::bench::FmaPeak& p : peaks) std::printf(" %s %.1f GFLOP/s", p.isa.c_str(), p.gflops);
  const dpe::bench::FmaPeak widest = dpe::bench::widest(peaks);
  const double peak = widest.gflops;
  std::printf("\n  -> single-core FP32 peak used below: %.1f GFLOP/s (%s; %d threads: %.1f GFLOP/s = threads x peak)\n",
              peak, widest.isa.c_str(), all_threads, peak * all_threads);
  std::printf("OpenBLAS core: %s (OPENBLAS_CORETYPE=%s); oneDNN picks its own ISA\n\n", openblas_get_corename(),
              std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "unset");

  const Shape shapes[] = {
      {"square 256", 256, 256, 256, Transpose::No, Transpose::No},
      {"square 512", 512, 512, 512, Transpose::No, Transpose::No},
      {"square 1024", 1024, 1024, 1024, Transpose::No, Transpose::No},
      {"square 2048", 2048, 2048, 2048, Transpose::No, Transpose::No},
      // Linear layers of the MLP, batch 256, weights W: (in, out); y = x W.
      {"fc1 fwd  x@W     256x784 @ 784x512", 256, 512, 784, Transpose::No, Transpose::No},
      {"fc1 dW   x^T@dy  784x256 @ 256x512", 784, 512, 256, Transpose::Yes, Transpose::No},
      {"fc1 dx   dy@W^T  256x512 @ 512x784", 256, 784, 512, Transpose::No, Transpose::Yes},
      {"fc2 fwd  h@W     256x512 @ 512x512", 256, 512, 512, Transpose::No, Transpose::No},
      {"fc2 dW   h^T@dy  512x256 @ 256x512", 512, 512, 256, Transpose::Yes, Transpose::No},
      {"fc2 dx   dy@W^T  256x512 @ 512x512", 256, 512, 512, Transpose::No, Transpose::Yes},
  };

  std::vector<int> thread_counts = {1};
  if (all_threads > 1) thread_counts.push_back(all_threads);
  std::printf("%-36s %7s %14s %7s %18s %7s %14s\n", "shape (m x k @ k x n)", "threads", "gemm_cpu GF/s", "% peak",
              "B 16 B off: GF/s", "% peak", "OpenBLAS GF/s");
  for (int threads : thread_counts) {
    tbb::task_arena arena(threads);
    arena.execute([&] {
      omp_set_num_threads(threads);
      openblas_set_num_threads(threads);
      for (const Shape& s : shapes) {
        const double dpe_gflops = time_gemm(Library::Dpe, s, min_seconds);
        const double dpe_offset_gflops = time_gemm(Library::Dpe, s, min_seconds, 16);
        const double blas_gflops = time_gemm(Library::OpenBlas, s, min_seconds);
        std::printf("%-36s %7d %14.1f %6.1f%% %18.1f %6.1f%% %14.1f\n", s.name, threads, dpe_gflops,
                    100.0 * dpe_gflops / (peak * threads), dpe_offset_gflops,
                    100.0 * dpe_offset_gflops / (peak * threads), blas_gflops);
        std::fflush(stdout);
      }
    });
  }
  return 0;
}
