#include "engine/zero_layout.h"

#include <algorithm>

#include "core/error.h"

namespace dpe {

ZeroLayout::ZeroLayout(const std::vector<std::vector<size_t>>& buckets, const std::vector<int64_t>& numels,
                       size_t ranks)
    : ranks_(ranks), bucket_offset_(numels.size(), 0), pieces_(ranks) {
  DPE_INTERNAL_ASSERT(ranks >= 1, "ZeroLayout: no rank");
  const auto n = static_cast<int64_t>(ranks);
  for (size_t b = 0; b < buckets.size(); ++b) {
    int64_t total = 0;
    for (size_t p : buckets[b]) {
      DPE_INTERNAL_ASSERT(p < numels.size(), "ZeroLayout: parameter ", p, " of ", numels.size());
      bucket_offset_[p] = total;
      total += numels[p];
    }
    const int64_t shard = (total + n - 1) / n;
    shard_numel_.push_back(shard);
    for (size_t k = 0; k < ranks; ++k) {
      const int64_t lo = static_cast<int64_t>(k) * shard;
      const int64_t hi = std::min(total, lo + shard);
      for (size_t p : buckets[b]) {
        const int64_t begin = std::max(lo, bucket_offset_[p]);
        const int64_t end = std::min(hi, bucket_offset_[p] + numels[p]);
        if (begin >= end) continue;
        pieces_[k].push_back(ZeroPiece{.param = p, .start = begin - bucket_offset_[p], .length = end - begin,
                                       .bucket = b, .shard_offset = begin - lo});
      }
    }
  }
}

int64_t ZeroLayout::owned_numel(size_t rank) const {
  int64_t total = 0;
  for (const ZeroPiece& piece : pieces_[rank]) total += piece.length;
  return total;
}

}  // namespace dpe
