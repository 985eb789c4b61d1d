#include "engine/batch_split.h"

#include "core/error.h"

namespace dpe {

BatchSplit::BatchSplit(const DataParallelOptions& options, size_t devices) : options_(options), devices_(devices) {
  if (options_.split == SplitRule::Auto) auto_ = std::make_unique<AutoSplit>(static_cast<int>(devices_));
}

std::vector<int64_t> BatchSplit::chunk_sizes(int64_t batch) const {
  const int64_t n = static_cast<int64_t>(devices_);
  // The auto split keeps every device in use once the batch has a sample for each.
  if (!auto_ || batch < n * AutoSplit::kMinChunk) {
    return compute_chunk_sizes(batch, n, auto_ ? SplitRule::Chunk : options_.split, options_.split_weights);
  }
  return auto_->sizes(batch);
}

// Note [What the auto split measures]
bool BatchSplit::observe(StepReport& report) {
  if (!auto_) return false;
  std::vector<int64_t> samples = report.chunk_sizes;
  samples.resize(devices_, 0);
  report.device_compute_ms.resize(devices_, 0.0);
  const std::vector<double> before = auto_->weights();
  auto_->observe(samples, report.device_compute_ms);
  report.split_weights = auto_->weights();
  report.ms_per_sample = auto_->ms_per_sample();
  return auto_->weights() != before;
}

void BatchSplit::rule_changed() { auto_.reset(); }

void BatchSplit::drop() {
  --devices_;
  if (auto_) auto_ = std::make_unique<AutoSplit>(static_cast<int>(devices_));
}

int64_t step_batch(const Tensor& input, const Tensor& target, int64_t dim, int64_t* normalized) {
  *normalized = normalize_dim(dim, input.dim(), "DataParallel::forward_backward");
  const int64_t batch = input.size(*normalized);
  DPE_CHECK(target.dim() > *normalized && target.size(*normalized) == batch, "DataParallel::forward_backward: target ",
            shape_str(target.shape()), " does not match the input's batch of ", batch, " along dim ", *normalized);
  return batch;
}

BatchShards::BatchShards(int64_t dim, std::vector<int64_t> sizes)
    : dim(dim), sizes(std::move(sizes)), offsets(chunk_offsets(this->sizes)) {}

Tensor BatchShards::of(const Tensor& batch, size_t r, const Device& device, bool non_blocking) const {
  return batch.narrow(dim, offsets[r], sizes[r]).to(device, non_blocking).contiguous();
}

}  // namespace dpe
