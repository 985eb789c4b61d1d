// Host-to-device copy bandwidth: what pin_memory buys. For each size, one batch copied to cuda:0 from
//  - pageable memory (Tensor::to: staged by the driver, returns when done),
//  - pinned memory, blocking (Tensor::to(cuda, false): DMA, returns when done),
//  - pinned memory, non_blocking (enqueued; the host then waits once for the whole series on the stream).
// GB/s with GB = 1e9, best of --repeats series of --copies copies each. Needs a CUDA device; without one it
// says so and exits 0 (there is nothing to measure).
//
// Usage: bazel run //bench:h2d_copy_bench [-- --repeats=5 --copies=20]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "core/ops.h"
#include "core/pinned_memory.h"
#include "core/stream.h"

namespace {

using Clock = std::chrono::steady_clock;

int int_flag(int argc, char** argv, const char* name, int fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return std::atoi(argv[i] + prefix.size());
  }
  return fallback;
}

// Best GB/s over `repeats` series of `copies` calls of copy(), each series ended by a device synchronize.
double best_gbps(int repeats, int copies, size_t bytes, const std::function<void()>& copy) {
  const dpe::Device gpu = dpe::Device::cuda(0);
  copy();  // warm-up: allocator caches, first-touch
  dpe::synchronize(gpu);
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    auto start = Clock::now();
    for (int c = 0; c < copies; ++c) copy();
    dpe::synchronize(gpu);
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, static_cast<double>(bytes) * copies / seconds / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (!dpe::pinned_memory_available()) {
    std::printf("h2d_copy_bench: nothing to measure: %s\n", dpe::pinned_memory_unavailable_reason().c_str());
    return 0;
  }
  const int repeats = int_flag(argc, argv, "repeats", 5), copies = int_flag(argc, argv, "copies", 20);
  const dpe::Device gpu = dpe::Device::cuda(0);
  std::printf("host -> %s copy bandwidth, GB/s (best of %d x %d copies)\n", gpu.str().c_str(), repeats, copies);
  std::printf("%12s %12s %16s %20s\n", "bytes", "pageable", "pinned blocking", "pinned non_blocking");
  for (int64_t floats : {int64_t{1} << 10, int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 24}) {
    dpe::Tensor pageable = dpe::ones({floats});
    dpe::Tensor pinned = pageable.pin_memory();
    const size_t bytes = pageable.nbytes();
    double a = best_gbps(repeats, copies, bytes, [&] { (void)pageable.to(gpu); });
    double b = best_gbps(repeats, copies, bytes, [&] { (void)pinned.to(gpu, /*non_blocking=*/false); });
    double c = best_gbps(repeats, copies, bytes, [&] { (void)pinned.to(gpu, /*non_blocking=*/true); });
    std::printf("%12zu %12.2f %16.2f %20.2f\n", bytes, a, b, c);
  }
  return 0;
}
