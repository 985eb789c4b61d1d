#include "core/backends.h"

#include <atomic>

namespace dpe::backends::cudnn {
namespace {
std::atomic<bool> benchmark_on{false};
}  // namespace

void set_benchmark(bool on) { benchmark_on.store(on, std::memory_order_relaxed); }
bool benchmark() { return benchmark_on.load(std::memory_order_relaxed); }

}  // namespace dpe::backends::cudnn
