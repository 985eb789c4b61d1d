#include "collectives/collective_types.h"

#include <algorithm>
#include <cmath>

namespace dpe {

const char* backend_name(CollectiveBackend backend) {
  switch (backend) {
    case CollectiveBackend::Auto: return "auto";
    case CollectiveBackend::Cpu: return "cpu";
    case CollectiveBackend::PeerCopy: return "peer-copy";
    case CollectiveBackend::Nccl: return "nccl";
    case CollectiveBackend::Mpi: return "mpi";
    case CollectiveBackend::MpiNccl: return "mpi-nccl";
  }
  return "?";
}

const char* collective_name(Collective c) {
  static constexpr const char* kNames[kNumCollectives] = {
      "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
      "gather", "scatter", "all_to_all", "barrier", "broadcast_object",
      "all_reduce_into"};
  return kNames[static_cast<size_t>(c)];
}

std::pair<int64_t, int64_t> collectives::work_range(int64_t count, size_t element_bytes, int n, int rank,
                                                    const std::vector<double>& shares) {
  const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(element_bytes));
  auto boundary = [&](int r) {
    double before = 0;
    for (int k = 0; k < r; ++k) before += shares.empty() ? 1.0 / n : shares[static_cast<size_t>(k)];
    const auto at = static_cast<int64_t>(std::llround(before * static_cast<double>(count)));
    return r == n ? count : std::min(count, (at + align - 1) / align * align);
  };
  return {boundary(rank), boundary(rank + 1)};
}

}  // namespace dpe
