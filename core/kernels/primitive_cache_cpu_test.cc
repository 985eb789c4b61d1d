// PrimitiveCache (core/kernels/primitive_cache.h): built once per key, least recently used out first, nothing
// cached when the build throws, an evicted value alive while someone holds it, and many threads meeting one
// new key get one value.
#include "core/kernels/primitive_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

namespace dpe::kernels::detail {
namespace {

TEST(PrimitiveCache, BuildsOncePerKeyAndEvictsTheLeastRecentlyUsed) {
  PrimitiveCache<int, int> cache(2);
  int builds = 0;
  auto get = [&](int key) { return *cache.get(key, [&] { return ++builds, key * 10; }); };
  EXPECT_EQ(get(1), 10);
  EXPECT_EQ(get(2), 20);
  EXPECT_EQ(get(1), 10);  // cached; 1 is now the most recent
  EXPECT_EQ(builds, 2);
  EXPECT_EQ(get(3), 30);  // evicts 2, the least recently used
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(builds, 3);
  EXPECT_EQ(get(1), 10);
  EXPECT_EQ(builds, 3);  // 1 stayed
  EXPECT_EQ(get(2), 20);
  EXPECT_EQ(builds, 4);  // 2 was built again
  EXPECT_EQ(cache.size(), 2u);
}

TEST(PrimitiveCache, AFailedBuildCachesNothing) {
  PrimitiveCache<int, int> cache(4);
  EXPECT_THROW(cache.get(7, []() -> int { throw std::runtime_error("out of memory"); }), std::runtime_error);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(*cache.get(7, [] { return 70; }), 70);
}

TEST(PrimitiveCache, AnEvictedValueLivesWhileHeld) {
  PrimitiveCache<int, std::vector<int>> cache(1);
  std::shared_ptr<const std::vector<int>> held = cache.get(1, [] { return std::vector<int>(1000, 1); });
  cache.get(2, [] { return std::vector<int>(10, 2); });  // evicts 1
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(held->size(), 1000u);
  EXPECT_EQ((*held)[999], 1);
}

TEST(PrimitiveCache, ThreadsMeetingANewKeyGetOneValue) {
  PrimitiveCache<int, int> cache(8);
  std::atomic<int> builds{0};
  std::vector<std::shared_ptr<const int>> got(8);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] { got[t] = cache.get(5, [&] { return ++builds, 50; }); });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GE(builds.load(), 1);  // racing threads may each build; the first kept is what everyone gets next
  for (const auto& v : got) EXPECT_EQ(*v, 50);
  EXPECT_EQ(cache.get(5, [] { return -1; }).get(), cache.get(5, [] { return -1; }).get());
  EXPECT_EQ(cache.size(), 1u);
}

}  // namespace
}  // namespace dpe::kernels::detail
