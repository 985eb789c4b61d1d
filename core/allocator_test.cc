#include "core/allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/ops.h"

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
