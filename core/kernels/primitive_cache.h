// A bounded cache of things costly to build and cheap to keep for a while: the CPU kernels' oneDNN primitives
// (Note [oneDNN primitive cache] in conv_cpu.cc; onednn_matmul_cpu.cc), one per shape.
//
// Why bounded: a primitive holds its JIT-compiled kernels (a float32 matmul primitive ~94 KB, measured over
// 960 batch sizes of the MLP's first layer), and every distinct shape builds one, so a program whose shapes
// keep changing (batch sizes, sequence lengths) grew without end. Least recently used out first; an evicted
// primitive is built again (~0.2 ms for that matmul) if its shape comes back.
//
// Thread-safety: get() may run on any number of threads. Values are handed out as shared_ptr, so a primitive
// evicted while another thread runs it lives until that call ends. build() runs outside the lock (JIT
// compilation takes milliseconds and must not stall the other devices): two threads meeting a new key at once
// may both build it, and the first to finish is kept.
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace dpe::kernels::detail {

// Per cache: 256 float32 matmul primitives are ~24 MB.
inline constexpr size_t kPrimitiveCacheCapacity = 256;

template <typename Key, typename Value>
class PrimitiveCache {
 public:
  explicit PrimitiveCache(size_t capacity = kPrimitiveCacheCapacity) : capacity_(capacity) {}
  PrimitiveCache(const PrimitiveCache&) = delete;
  PrimitiveCache& operator=(const PrimitiveCache&) = delete;

  // The cached value of `key`, or build()'s (a Value), cached. What build() throws propagates; nothing is
  // cached then.
  template <typename Build>
  std::shared_ptr<const Value> get(const Key& key, Build&& build) {
    {
      std::lock_guard lock(mutex_);
      auto it = index_.find(key);
      if (it != index_.end()) {
        recent_.splice(recent_.begin(), recent_, it->second);
        return it->second->second;
      }
    }
    auto built = std::make_shared<const Value>(build());
    std::lock_guard lock(mutex_);
    auto it = index_.find(key);
    if (it != index_.end()) return it->second->second;  // built meanwhile by another thread
    recent_.emplace_front(key, std::move(built));
    index_.emplace(key, recent_.begin());
    if (recent_.size() > capacity_) {
      index_.erase(recent_.back().first);
      recent_.pop_back();
    }
    return recent_.front().second;
  }

  size_t size() const {
    std::lock_guard lock(mutex_);
    return recent_.size();
  }

 private:
  using Entry = std::pair<Key, std::shared_ptr<const Value>>;
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> recent_;  // most recently used first
  std::map<Key, typename std::list<Entry>::iterator> index_;
};

}  // namespace dpe::kernels::detail
