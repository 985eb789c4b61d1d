#include "scatter_gather/chunking.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace dpe {

std::string split_rule_name(SplitRule rule) {
  switch (rule) {
    case SplitRule::Chunk: return "chunk";
    case SplitRule::Balanced: return "balanced";
    case SplitRule::Weighted: return "weighted";
  }
  return "?";
}

std::vector<int64_t> compute_chunk_sizes(int64_t batch, int64_t num_devices, SplitRule rule,
                                         const std::vector<double>& weights) {
  DPE_CHECK(batch >= 0, "chunk sizes: batch size ", batch, " is negative");
  DPE_CHECK(num_devices >= 1, "chunk sizes: expected at least one device, got ", num_devices);
  std::vector<int64_t> sizes;
  switch (rule) {
    case SplitRule::Chunk: {
      int64_t chunk = std::max<int64_t>((batch + num_devices - 1) / num_devices, 1);
      for (int64_t start = 0; start < batch; start += chunk) sizes.push_back(std::min(chunk, batch - start));
      break;
    }
    case SplitRule::Balanced: {
      for (int64_t i = 0; i < num_devices; ++i) sizes.push_back(batch / num_devices + (i < batch % num_devices));
      break;
    }
    case SplitRule::Weighted: {
      DPE_CHECK(static_cast<int64_t>(weights.size()) == num_devices, "weighted split: ", weights.size(),
                " weights for ", num_devices, " devices");
      double total = 0;
      for (double w : weights) {
        DPE_CHECK(w >= 0 && std::isfinite(w), "weighted split: weight ", w, " is not a finite non-negative number");
        total += w;
      }
      DPE_CHECK(total > 0, "weighted split: the weights sum to 0");
      std::vector<double> remainders(num_devices);
      int64_t assigned = 0;
      for (int64_t i = 0; i < num_devices; ++i) {
        double exact = batch * weights[i] / total;
        sizes.push_back(static_cast<int64_t>(std::floor(exact)));
        remainders[i] = exact - sizes.back();
        assigned += sizes.back();
      }
      std::vector<int64_t> order(num_devices);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return remainders[a] > remainders[b]; });
      for (int64_t k = 0; assigned < batch; ++k, ++assigned) ++sizes[order[k % num_devices]];
      break;
    }
  }
  std::erase(sizes, 0);
  if (sizes.empty()) sizes.push_back(0);
  return sizes;
}

}  // namespace dpe
