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
    case SplitRule::Auto: return "auto";
  }
  return "?";
}

std::vector<int64_t> apportion(int64_t batch, const std::vector<double>& weights) {
  DPE_CHECK(batch >= 0, "chunk sizes: batch size ", batch, " is negative");
  double total = 0, largest = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double w = weights[i];
    DPE_CHECK(w >= 0 && std::isfinite(w), "weighted split: weight ", i, " is ", w,
              "; expected a finite non-negative number");
    total += w;
    largest = std::max(largest, w);
  }
  DPE_CHECK(total > 0, "weighted split: the weights sum to 0; expected at least one positive weight");
  // Weights so large that their sum or batch * w overflows to inf are scaled by the largest first; every
  // other case keeps the plain formula (and its rounding) below.
  const bool rescale = !std::isfinite(total) || largest > 1e200;
  if (rescale) {
    total = 0;
    for (double w : weights) total += w / largest;
  }
  const int64_t num_devices = static_cast<int64_t>(weights.size());
  std::vector<int64_t> sizes;
  std::vector<double> remainders(num_devices);
  const double limit = 9223372036854775808.0;  // 2^63: the first double that does not fit in int64
  for (int64_t i = 0; i < num_devices; ++i) {
    const double w = rescale ? weights[i] / largest : weights[i];
    const double exact = static_cast<double>(batch) * w / total;
    const double whole = std::floor(exact);
    // Rounding may put `exact` a little above the batch (2^63 for INT64_MAX): clamp before converting.
    const int64_t size = whole >= limit ? batch : std::min(static_cast<int64_t>(whole), batch);
    sizes.push_back(size);
    // A zero weight never gets an item: its remainder sorts after every real one.
    remainders[i] = weights[i] > 0 ? exact - whole : -1;
  }
  std::vector<int64_t> order(num_devices);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return remainders[a] > remainders[b]; });
  // Rounding (batches above 2^53, or a quotient landing on a whole number) can make the floors add up to
  // more than the batch: cap them in device order, so the sum never exceeds (nor overflows past) batch.
  int64_t sum = 0;
  for (int64_t& s : sizes) {
    s = std::min(s, batch - sum);
    sum += s;
  }
  // The leftover items (fewer than the devices, except after the rounding above) go to the devices with
  // positive weight, largest remainder first, one each in turn: leftover / p to each of the p devices
  // plus one more to the first leftover % p, in O(n) however large the leftover.
  const int64_t leftover = batch - sum;
  const int64_t positive = std::count_if(weights.begin(), weights.end(), [](double w) { return w > 0; });
  for (int64_t k = 0; k < positive; ++k) {
    sizes[order[k]] += leftover / positive + (k < leftover % positive);
  }
  return sizes;
}

// Every size is computed without overflow for any batch up to INT64_MAX (a batch near it once wrapped
// ceil(B/n) negative and pushed INT64_MAX chunks of 1), and the result has at most min(B, n) entries, so a
// huge num_devices allocates nothing more than a huge batch does.
std::vector<int64_t> compute_chunk_sizes(int64_t batch, int64_t num_devices, SplitRule rule,
                                         const std::vector<double>& weights) {
  DPE_CHECK(batch >= 0, "chunk sizes: batch size ", batch, " is negative");
  DPE_CHECK(num_devices >= 1, "chunk sizes: expected at least one device, got ", num_devices);
  std::vector<int64_t> sizes;
  switch (rule) {
    case SplitRule::Chunk: {
      // ceil(batch / n) without forming batch + n - 1; then at most n chunks, the last one what remains.
      const int64_t chunk = std::max<int64_t>(batch / num_devices + (batch % num_devices != 0), 1);
      for (int64_t remaining = batch; remaining > 0; remaining -= sizes.back()) {
        sizes.push_back(std::min(chunk, remaining));
      }
      break;
    }
    case SplitRule::Balanced: {
      // Chunks past the batch would be empty: only min(batch, n) of them are formed.
      const int64_t used = std::min(batch, num_devices);
      for (int64_t i = 0; i < used; ++i) sizes.push_back(batch / num_devices + (i < batch % num_devices));
      break;
    }
    case SplitRule::Weighted:
      DPE_CHECK(static_cast<int64_t>(weights.size()) == num_devices, "weighted split: ", weights.size(),
                " weights for ", num_devices, " devices");
      sizes = apportion(batch, weights);
      break;
    case SplitRule::Auto:
      DPE_CHECK(false, "chunk sizes: the auto split is the engine's (its weights come from measuring the devices, "
                "scatter_gather/auto_split.h); expected chunk, balanced or weighted here");
  }
  // Only trailing empties go: a middle device whose share is zero keeps its place (PyTorch's chunk rule never
  // leaves one; the weighted rule does), so that chunk i always belongs to device i.
  while (sizes.size() > 1 && sizes.back() == 0) sizes.pop_back();
  if (sizes.empty()) sizes.push_back(0);
  return sizes;
}

std::vector<int64_t> chunk_offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets(sizes.size(), 0);
  for (size_t i = 1; i < sizes.size(); ++i) offsets[i] = offsets[i - 1] + sizes[i - 1];
  return offsets;
}

}  // namespace dpe
