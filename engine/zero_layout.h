// ZeroLayout: which device of a ZeRO group owns which elements of the trainable parameters (docs/MEMORY.md).
//
// Every gradient bucket of the DDP reducer (engine/ddp_reducer.h: its parameters side by side, in bucket order)
// is cut into `ranks` equal shards of ceil(numel / ranks) elements, the last padded: rank k owns shard k of every
// bucket. So ownership is balanced to within one element per bucket whatever the parameters' sizes (a large
// embedding is shared like everything else), a bucket's reduce-scatter hands each rank exactly the gradients it
// owns, and the all-gather after the optimizer gives them back. A parameter crosses at most one boundary per
// rank: each rank owns at most one piece of it, a contiguous range of its elements (row-major), which is what
// its optimizer steps. The layout depends only on the buckets, the parameters' sizes and the rank count: the same
// on every rank, and for any process count with the same ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dpe {

struct ZeroPiece {
  size_t param = 0;          // index into the reducer's parameter list
  int64_t start = 0;         // first element of the parameter it covers
  int64_t length = 0;        // elements (> 0)
  size_t bucket = 0;
  int64_t shard_offset = 0;  // where it lies in its rank's shard of the bucket
};

class ZeroLayout {
 public:
  // buckets: parameter indices per bucket (the reducer's); numels: per parameter; ranks >= 1.
  ZeroLayout(const std::vector<std::vector<size_t>>& buckets, const std::vector<int64_t>& numels, size_t ranks);

  size_t ranks() const { return ranks_; }
  size_t num_buckets() const { return shard_numel_.size(); }
  // Elements of one rank's shard of bucket b (the bucket padded to ranks x this).
  int64_t shard_numel(size_t bucket) const { return shard_numel_[bucket]; }
  // The bucket padded to whole shards: what a reduce-scatter takes and an all-gather gives.
  int64_t padded_numel(size_t bucket) const { return shard_numel_[bucket] * static_cast<int64_t>(ranks()); }
  // Where parameter p lies in its bucket (elements).
  int64_t bucket_offset(size_t param) const { return bucket_offset_[param]; }
  // Rank k's pieces, by bucket then position in the bucket.
  const std::vector<ZeroPiece>& pieces(size_t rank) const { return pieces_[rank]; }
  // Elements rank k owns (padding excluded).
  int64_t owned_numel(size_t rank) const;

 private:
  size_t ranks_;
  std::vector<int64_t> shard_numel_;
  std::vector<int64_t> bucket_offset_;
  std::vector<std::vector<ZeroPiece>> pieces_;
};

}  // namespace dpe
