#include "core/allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "tests/testing/failing_new.h"

namespace dpe {
namespace {

TEST(AllocatorTest, CountsCurrentAndPeakPerDevice) {
  Device d0 = Device::cpu(0), d1 = Device::cpu(1);
  empty_cache(d1);
  MemoryStats base0 = memory_stats(d0), base1 = memory_stats(d1);
  reset_peak_memory_stats(d1);
  {
    Tensor a = Tensor::empty({1024}, TensorOptions(Device::cpu(1)));  // 4 KiB
    Tensor b = Tensor::empty({256}, TensorOptions(Device::cpu(1)));   // 1 KiB
    EXPECT_EQ(memory_stats(d1).allocated_bytes - base1.allocated_bytes, 4096 + 1024);
    EXPECT_EQ(memory_stats(d0).allocated_bytes, base0.allocated_bytes);  // other device untouched
  }
  MemoryStats after = memory_stats(d1);
  EXPECT_EQ(after.allocated_bytes, base1.allocated_bytes);
  EXPECT_EQ(after.peak_allocated_bytes, base1.allocated_bytes + 4096 + 1024);
  EXPECT_GE(after.reserved_bytes, 4096 + 1024);  // cached, not returned
  reset_peak_memory_stats(d1);
  EXPECT_EQ(memory_stats(d1).peak_allocated_bytes, after.allocated_bytes);
  empty_cache(d1);
  EXPECT_EQ(memory_stats(d1).reserved_bytes, memory_stats(d1).allocated_bytes);
}

// A block counts as the kind its allocating thread had (MemoryKindGuard), moves with set_memory_kind, leaves its
// kind's count when freed; the peak keeps the split it had when it was reached.
TEST(AllocatorTest, CountsBytesByKindAndTheSplitAtThePeak) {
  const Device d = Device::cpu(1);
  auto kind = [&](MemoryKind k) { return memory_stats(d).by_kind(k); };
  const MemoryStats base = memory_stats(d);
  reset_peak_memory_stats(d);
  {
    Tensor activation = Tensor::empty({1024}, TensorOptions(d));  // 4 KiB, the default kind
    Tensor state;
    {
      MemoryKindGuard optimizer(MemoryKind::OptimizerState);
      state = Tensor::empty({512}, TensorOptions(d));  // 2 KiB
      {
        MemoryKindGuard inner(MemoryKind::Parameters);
        EXPECT_EQ(current_memory_kind(), MemoryKind::Parameters);
      }
      EXPECT_EQ(current_memory_kind(), MemoryKind::OptimizerState);
    }
    EXPECT_EQ(current_memory_kind(), MemoryKind::Activations);
    EXPECT_EQ(kind(MemoryKind::Activations) - base.by_kind(MemoryKind::Activations), 4096);
    EXPECT_EQ(kind(MemoryKind::OptimizerState) - base.by_kind(MemoryKind::OptimizerState), 2048);
    // Another thread's allocations keep their own kind.
    std::thread([&] { Tensor elsewhere = Tensor::empty({256}, TensorOptions(d)); }).join();
    EXPECT_EQ(kind(MemoryKind::OptimizerState) - base.by_kind(MemoryKind::OptimizerState), 2048);

    Tensor grad = Tensor::empty({256}, TensorOptions(d));  // 1 KiB: the peak is reached here
    const MemoryStats at_peak = memory_stats(d);
    grad.storage()->set_memory_kind(MemoryKind::Gradients);
    EXPECT_EQ(kind(MemoryKind::Gradients) - base.by_kind(MemoryKind::Gradients), 1024);
    EXPECT_EQ(kind(MemoryKind::Activations) - base.by_kind(MemoryKind::Activations), 4096);
    const MemoryStats now = memory_stats(d);
    EXPECT_EQ(now.peak_allocated_bytes, at_peak.peak_allocated_bytes);
    EXPECT_EQ(now.at_peak(MemoryKind::Activations), at_peak.by_kind(MemoryKind::Activations));  // not retold
    int64_t sum = 0;
    for (int64_t bytes : now.peak_by_kind) sum += bytes;
    EXPECT_EQ(sum, now.peak_allocated_bytes);
  }
  for (size_t k = 0; k < kMemoryKinds; ++k) {
    EXPECT_EQ(memory_stats(d).allocated_by_kind[k], base.allocated_by_kind[k])
        << memory_kind_name(static_cast<MemoryKind>(k));
  }
}

TEST(AllocatorTest, ReusesCachedBlocksOfTheSameSize) {
  Device d = Device::cpu(1);
  { Tensor warm = Tensor::empty({1000}, TensorOptions(d)); }
  int64_t misses = memory_stats(d).num_backend_allocations;
  for (int i = 0; i < 10; ++i) Tensor again = Tensor::empty({1000}, TensorOptions(d));
  EXPECT_EQ(memory_stats(d).num_backend_allocations, misses);
}

TEST(AllocatorTest, RoundsSizes) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size((16u << 20) + 1), 17u << 20);
}

TEST(AllocatorTest, OutOfMemoryNamesTheDevice) {
  try {
    Tensor huge = Tensor::empty({int64_t{1} << 46}, TensorOptions(Device::cpu(1)));  // 256 TiB
    ADD_FAILURE() << "allocated 256 TiB";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory on cpu:1"), std::string::npos) << e.what();
  }
}

// Sizes within a MiB of SIZE_MAX once rounded up to a tiny block; now they are out of memory.
TEST(AllocatorTest, SizesNearSizeMaxDoNotWrap) {
  for (size_t nbytes : {SIZE_MAX, SIZE_MAX - 5, (size_t{1} << 63) + 1}) {
    try {
      allocator_for(Device::cpu(0)).allocate(nbytes);
      ADD_FAILURE() << "allocated " << nbytes << " bytes";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("out of memory: cannot allocate " + std::to_string(nbytes) + " bytes"),
                std::string::npos)
          << e.what();
    }
  }
}

class AlignedAllocBackend final : public BackendAllocator {
 public:
  void* allocate(size_t nbytes) override { return std::aligned_alloc(64, nbytes); }
  void deallocate(void* ptr) override { std::free(ptr); }
};

// Blocks are given back from destructors (Storage), where an exception ends the process in std::terminate.
// Giving one back once grew its size's free list, and under `ulimit -v` (dpe_errors_test) that push_back
// threw std::bad_alloc out of ~Storage. Now a block's place in the list is made when the block is created.
TEST(AllocatorTest, GivingBlocksBackAllocatesNothing) {
  CachingAllocator allocator(Device::cpu(0), std::make_unique<AlignedAllocBackend>());
  std::vector<std::pair<void*, size_t>> blocks;
  for (size_t nbytes : {size_t{100}, size_t{600}, size_t{5000}, size_t{70000}, size_t{17} << 20}) {
    for (int i = 0; i < 9; ++i) blocks.emplace_back(allocator.allocate(nbytes), nbytes);
  }
  {
    testing::FailingNew fail;
    for (auto [ptr, nbytes] : blocks) allocator.deallocate(ptr, nbytes);  // noexcept: bad_alloc would terminate
  }
  EXPECT_EQ(allocator.stats().allocated_bytes, 0);
  const int64_t backend_allocations = allocator.stats().num_backend_allocations;
  for (auto& [ptr, nbytes] : blocks) ptr = allocator.allocate(nbytes);  // all from the cache
  EXPECT_EQ(allocator.stats().num_backend_allocations, backend_allocations);

  // empty_cache gives back the cached blocks and keeps the places of those still in use.
  allocator.deallocate(blocks[0].first, blocks[0].second);
  allocator.empty_cache();
  {
    testing::FailingNew fail;
    for (size_t i = 1; i < blocks.size(); ++i) allocator.deallocate(blocks[i].first, blocks[i].second);
  }
  EXPECT_EQ(allocator.stats().allocated_bytes, 0);
  allocator.empty_cache();
  EXPECT_EQ(allocator.stats().reserved_bytes, 0);
}

TEST(AllocatorTest, ThreadSafe) {
  Device d = Device::cpu(0);
  int64_t before = memory_stats(d).allocated_bytes;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) Tensor x = Tensor::empty({int64_t(i % 7 + 1) * 100}, TensorOptions(d));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(memory_stats(d).allocated_bytes, before);
}

}  // namespace
}  // namespace dpe
