#include "data/distributed_sampler.h"

#include <numeric>
#include <utility>

#include "core/error.h"

namespace dpe::data {
namespace {

// splitmix64 (Steele, Lea, Flood 2014): a fixed, portable 64-bit generator; one state word, full period.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // Uniform in [0, bound), bound >= 1, without modulo bias: draws below 2^64 mod bound are rejected.
  uint64_t below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
    for (;;) {
      uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  uint64_t state_;
};

// 0..n-1 shuffled by Fisher-Yates (Durstenfeld): the same permutation for the same (n, seed), everywhere.
std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), int64_t{0});
  SplitMix64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options)
    : dataset_size_(dataset_size), options_(options) {
  const int64_t R = options_.num_replicas;
  DPE_CHECK(R >= 1, "DistributedSampler: num_replicas ", R, " is invalid; expected num_replicas >= 1");
  DPE_CHECK(options_.rank >= 0 && options_.rank < R, "DistributedSampler: rank ", options_.rank,
            " is out of range for num_replicas ", R, "; expected 0 <= rank < ", R);
  DPE_CHECK(dataset_size >= 0, "DistributedSampler: dataset size ", dataset_size, " is negative");
  // PyTorch: drop_last and len % R != 0 -> ceil((len - R) / R), which equals floor(len / R) (0 when len < R);
  // otherwise ceil(len / R). Written without len + R - 1, which could overflow.
  num_samples_ = dataset_size / R + (!options_.drop_last && dataset_size % R != 0 ? 1 : 0);
}

std::vector<int64_t> DistributedSampler::indices() const {
  // base: (len)  padded: (total_size)  result: (num_samples), result[k] = padded[rank + k * R].
  const int64_t R = options_.num_replicas;
  const int64_t total = total_size();
  std::vector<int64_t> result;
  if (total == 0) return result;  // len 0, or drop_last with len < R
  DPE_INTERNAL_ASSERT(dataset_size_ > 0);

  std::vector<int64_t> base;
  if (options_.shuffle) {
    base = permutation(dataset_size_, options_.seed + static_cast<uint64_t>(epoch_));
  } else {
    base.resize(dataset_size_);
    std::iota(base.begin(), base.end(), int64_t{0});
  }
  // Padding repeats base from its start (PyTorch: indices += (indices * ceil(pad / len))[:pad]) and
  // drop_last truncates it, so in both cases padded[i] = base[i % len] for i < total_size.
  result.reserve(num_samples_);
  for (int64_t i = options_.rank; i < total; i += R) result.push_back(base[i % dataset_size_]);
  DPE_INTERNAL_ASSERT(static_cast<int64_t>(result.size()) == num_samples_);
  return result;
}

}  // namespace dpe::data
