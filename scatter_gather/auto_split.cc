#include "scatter_gather/auto_split.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "scatter_gather/chunking.h"

namespace dpe {

AutoSplit::AutoSplit(int devices) {
  DPE_CHECK(devices >= 1, "auto split: expected at least one device, got ", devices);
  weights_.assign(static_cast<size_t>(devices), 1.0 / devices);
  ms_per_sample_.assign(static_cast<size_t>(devices), 0.0);
}

std::vector<int64_t> AutoSplit::sizes(int64_t batch) const {
  DPE_CHECK(batch >= 0, "auto split: batch size ", batch, " is negative");
  const int64_t n = static_cast<int64_t>(weights_.size());
  // The floors first, the rest by the weights' shares (the weighted split's apportionment).
  const int64_t floor_each = batch >= n * kMinChunk ? kMinChunk : 0;
  std::vector<int64_t> sizes = apportion(batch - floor_each * n, weights_);
  for (int64_t& s : sizes) s += floor_each;
  return sizes;
}

void AutoSplit::observe(const std::vector<int64_t>& samples, const std::vector<double>& milliseconds) {
  DPE_CHECK(samples.size() == weights_.size() && milliseconds.size() == weights_.size(), "auto split: ",
            samples.size(), " sample counts and ", milliseconds.size(), " times for ", weights_.size(), " devices");
  for (size_t d = 0; d < weights_.size(); ++d) {
    if (samples[d] <= 0 || !(milliseconds[d] > 0)) continue;
    const double now = milliseconds[d] / static_cast<double>(samples[d]);
    ms_per_sample_[d] = ms_per_sample_[d] == 0 ? now : kSmoothing * now + (1 - kSmoothing) * ms_per_sample_[d];
  }
  if (++observed_ % kEvery != 0) return;
  if (std::any_of(ms_per_sample_.begin(), ms_per_sample_.end(), [](double t) { return t == 0; })) return;
  std::vector<double> speed(weights_.size());
  for (size_t d = 0; d < speed.size(); ++d) speed[d] = 1.0 / ms_per_sample_[d];
  const double total = std::accumulate(speed.begin(), speed.end(), 0.0);
  double largest_move = 0;
  for (size_t d = 0; d < speed.size(); ++d) {
    speed[d] /= total;
    largest_move = std::max(largest_move, std::abs(speed[d] - weights_[d]));
  }
  if (largest_move > kHysteresis) weights_ = speed;
}

}  // namespace dpe
