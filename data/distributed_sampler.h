// DistributedSampler: PyTorch's torch.utils.data.DistributedSampler, index for index (shuffle aside).
//
//   DistributedSampler sampler(dataset.size(), {.num_replicas = world_size, .rank = rank});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);                       // new order each epoch, the same on every rank
//     for (int64_t i : sampler.indices()) ...         // this rank's num_samples() indices
//   }
//
// Contract, for a dataset of len items and R = num_replicas (see docs/DATA_PARALLEL.md for the table):
//  1. base   = a permutation of 0..len-1 seeded by (seed + epoch) when shuffle, else 0..len-1.
//  2. not drop_last: base is padded to total_size() by repeating it from its start (as many whole copies as
//     needed, then truncated), so some indices are read twice;
//     drop_last:     base is truncated to total_size(), so the last len % R indices are not read.
//  3. rank r gets padded[r : total_size : R] (strided, not contiguous), num_samples() items.
//  num_samples() = drop_last ? floor(len / R) : ceil(len / R);  total_size() = num_samples() * R.
// This is PyTorch's __iter__ / __len__ exactly (its drop_last formula ceil((len - R) / R) is floor(len / R),
// including 0 when len < R). len = 0 gives every rank an empty list.
//
// The shuffled order is dpe's own: a Fisher-Yates shuffle driven by splitmix64 seeded with seed + epoch
// (mod 2^64), not torch.randperm, whose generator cannot be reproduced outside torch. It is a pure function
// of (len, seed, epoch): identical on every rank, on every call, on every platform; it changes with the epoch
// and the seed. With shuffle = false the indices match PyTorch's exactly.
//
// Thread-safety: the const methods may be called concurrently; set_epoch must not race with anything.
#pragma once

#include <cstdint>
#include <vector>

namespace dpe::data {

struct DistributedSamplerOptions {
  int64_t num_replicas = 1;  // R: the number of processes/devices reading the dataset, >= 1
  int64_t rank = 0;          // this replica, 0 <= rank < num_replicas
  bool shuffle = true;
  uint64_t seed = 0;         // must be the same on every rank
  bool drop_last = false;    // true: drop the tail that does not divide evenly; false: pad by repeating
};

class DistributedSampler {
 public:
  // Throws dpe::Error when dataset_size < 0, num_replicas < 1, or rank is outside [0, num_replicas).
  DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options);

  // This rank's indices for the current epoch, num_samples() of them, each in [0, dataset_size).
  std::vector<int64_t> indices() const;

  int64_t num_samples() const { return num_samples_; }  // PyTorch's len(sampler)
  int64_t total_size() const { return num_samples_ * options_.num_replicas; }
  int64_t dataset_size() const { return dataset_size_; }
  const DistributedSamplerOptions& options() const { return options_; }

  // Call at the start of every epoch (same value on every rank), or every epoch reuses one order.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

 private:
  int64_t dataset_size_;
  DistributedSamplerOptions options_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
};

}  // namespace dpe::data
