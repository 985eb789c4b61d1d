// Pinned host memory (core/pinned_memory.h).
//  - The caching logic runs everywhere, on a backend whose "events" the test completes by hand: a freed
//    block is reused only after every use recorded on it has completed, sizes are cached, out-of-memory
//    gives the cache back and then fails with the sizes.
//  - Without a CUDA device: pin_memory and pinned allocation fail with the reason; nothing is pinned.
//  - With one (skipped otherwise): pin_memory, non_blocking copies from pinned memory, and a block that a
//    stalled copy still reads is not handed out again.
#include "core/pinned_memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <vector>

#include "core/ops.h"
#include "tests/testing/errors.h"
#include "tests/testing/failing_new.h"

#if DPE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda/cuda_device.h"
#endif

namespace dpe {
namespace {

using testing::error_of;

// Host memory from aligned_alloc up to `limit` bytes; events are indices into `done`, set by the test.
struct FakeBackendState {
  size_t limit = SIZE_MAX;
  size_t held = 0;
  std::vector<bool> done;         // event i completed
  std::vector<int> event_device;  // the device event i was recorded for
  int destroyed_events = 0;
  int backend_frees = 0;
};

class FakeBackend final : public HostAllocatorBackend {
 public:
  explicit FakeBackend(FakeBackendState* state) : s_(state) {}
  void* allocate(size_t nbytes) override {
    if (s_->held + nbytes > s_->limit) return nullptr;
    s_->held += nbytes;
    void* p = std::aligned_alloc(64, nbytes);
    sizes_[p] = nbytes;
    return p;
  }
  void deallocate(void* ptr) override {
    s_->held -= sizes_.at(ptr);
    ++s_->backend_frees;
    std::free(ptr);
  }
  Event record_event(int device) override {
    s_->done.push_back(false);
    s_->event_device.push_back(device);
    return reinterpret_cast<Event>(s_->done.size());  // 1-based, so never null
  }
  bool query_event(Event e) override { return s_->done.at(reinterpret_cast<size_t>(e) - 1); }
  void destroy_event(Event) override { ++s_->destroyed_events; }

 private:
  FakeBackendState* s_;
  std::unordered_map<void*, size_t> sizes_;
};

TEST(CachingHostAllocatorTest, ReusesAFreedBlockOfTheSameRoundedSize) {
  FakeBackendState s;
  CachingHostAllocator alloc(std::make_unique<FakeBackend>(&s));
  EXPECT_EQ(alloc.allocate(0), nullptr);
  void* a = alloc.allocate(1000);
  EXPECT_EQ(alloc.stats().allocated_bytes, 1024);  // rounded like the device allocators (512-byte steps)
  alloc.deallocate(a);
  EXPECT_EQ(alloc.allocate(1024), a);  // same rounded size: from the cache
  void* b = alloc.allocate(1000);      // `a` is taken: a new block
  EXPECT_NE(b, a);
  MemoryStats st = alloc.stats();
  EXPECT_EQ(st.num_allocations, 3);
  EXPECT_EQ(st.num_backend_allocations, 2);
  EXPECT_EQ(st.allocated_bytes, 2048);
  EXPECT_EQ(st.reserved_bytes, 2048);
  alloc.deallocate(a);
  alloc.deallocate(b);
  EXPECT_EQ(alloc.stats().allocated_bytes, 0);
  EXPECT_EQ(alloc.stats().peak_allocated_bytes, 2048);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved_bytes, 0);
  EXPECT_EQ(s.held, 0u);
}

TEST(CachingHostAllocatorTest, ABlockIsNotReusedUntilEveryRecordedUseCompleted) {
  FakeBackendState s;
  CachingHostAllocator alloc(std::make_unique<FakeBackend>(&s));
  void* a = alloc.allocate(4096);
  EXPECT_TRUE(alloc.record_use(a, 0));  // e.g. a copy to cuda:0 still reading it
  EXPECT_TRUE(alloc.record_use(a, 1));  // and one to cuda:1
  EXPECT_EQ(s.event_device, (std::vector<int>{0, 1}));
  alloc.deallocate(a);

  void* b = alloc.allocate(4096);  // both uses pending: a must not come back
  EXPECT_NE(b, a);
  alloc.deallocate(b);
  s.done[0] = true;  // one use done, one pending
  void* c = alloc.allocate(4096);
  EXPECT_EQ(c, b);
  void* d = alloc.allocate(4096);
  EXPECT_NE(d, a);
  s.done[1] = true;  // now a is reusable, and its events are destroyed
  void* e = alloc.allocate(4096);
  EXPECT_EQ(e, a);
  EXPECT_EQ(s.destroyed_events, 2);
  for (void* p : {c, d, e}) alloc.deallocate(p);
}

TEST(CachingHostAllocatorTest, RecordUseOnlyMarksTheStartOfALiveBlock) {
  FakeBackendState s;
  CachingHostAllocator alloc(std::make_unique<FakeBackend>(&s));
  void* a = alloc.allocate(512);
  int on_stack = 0;
  EXPECT_FALSE(alloc.record_use(&on_stack, 0));                  // not pinned memory
  EXPECT_FALSE(alloc.record_use(static_cast<char*>(a) + 8, 0));  // inside, not the start
  alloc.deallocate(a);
  EXPECT_FALSE(alloc.record_use(a, 0));  // freed
  EXPECT_TRUE(s.done.empty());
}

TEST(CachingHostAllocatorTest, EmptyCacheKeepsBlocksACopyMayStillRead) {
  FakeBackendState s;
  CachingHostAllocator alloc(std::make_unique<FakeBackend>(&s));
  void* a = alloc.allocate(512);
  void* b = alloc.allocate(512);
  alloc.record_use(a, 0);
  alloc.deallocate(a);
  alloc.deallocate(b);
  alloc.empty_cache();
  EXPECT_EQ(s.backend_frees, 1);  // b only
  EXPECT_EQ(alloc.stats().reserved_bytes, 512);
  s.done[0] = true;
  alloc.empty_cache();
  EXPECT_EQ(s.backend_frees, 2);
  EXPECT_EQ(alloc.stats().reserved_bytes, 0);
}

TEST(CachingHostAllocatorTest, OutOfMemoryGivesTheCacheBackThenNamesTheSizes) {
  FakeBackendState s;
  s.limit = 4096;
  CachingHostAllocator alloc(std::make_unique<FakeBackend>(&s));
  void* a = alloc.allocate(2048);
  alloc.deallocate(a);               // cached: 2048 of 4096 held
  void* b = alloc.allocate(3072);    // fits only once the cached block is returned
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(s.backend_frees, 1);
  std::string message = error_of([&] { alloc.allocate(2048); });
  EXPECT_NE(message.find("out of pinned host memory: tried to allocate 2048 bytes with 3072 bytes already "
                         "allocated"), std::string::npos)
      << message;
  alloc.deallocate(b);
}

// Pinned blocks are given back from destructors (Storage): that must not allocate, whether the block goes
// to the cache or waits for a copy still reading it (core/allocator_test.cc's GivingBlocksBackAllocatesNothing).
TEST(CachingHostAllocatorTest, GivingBlocksBackAllocatesNothing) {
  FakeBackendState s;
  CachingHostAllocator alloc(std::make_unique<FakeBackend>(&s));
  std::vector<void*> blocks;
  for (size_t nbytes : {512u, 4096u, 70000u}) {
    for (int i = 0; i < 9; ++i) blocks.push_back(alloc.allocate(nbytes));
  }
  for (size_t i = 0; i < blocks.size(); i += 2) alloc.record_use(blocks[i], 0);  // a copy still reads these
  {
    testing::FailingNew fail;
    for (void* p : blocks) alloc.deallocate(p);  // noexcept: bad_alloc would terminate
  }
  EXPECT_EQ(alloc.stats().allocated_bytes, 0);
  alloc.empty_cache();
  EXPECT_EQ(s.backend_frees, 13);  // the 13 blocks no copy reads
  std::fill(s.done.begin(), s.done.end(), true);
  alloc.empty_cache();
  EXPECT_EQ(s.backend_frees, 27);
  EXPECT_EQ(s.held, 0u);
}

TEST(PinnedMemoryTest, AvailableExactlyWhereACudaDeviceIs) {
  EXPECT_EQ(pinned_memory_available(), cuda_available());
  EXPECT_EQ(pinned_memory_unavailable_reason().empty(), cuda_available());
  EXPECT_FALSE(ones({3}).is_pinned());
}

TEST(PinnedMemoryTest, WithoutCudaPinningFailsNamingTheReason) {
  if (pinned_memory_available()) GTEST_SKIP() << "a CUDA device is visible";
  const std::string reason = pinned_memory_unavailable_reason();
  for (const std::string& message :
       {error_of([] { ones({3}).pin_memory(); }),
        error_of([] { Tensor::empty({3}, TensorOptions().with_pinned_memory(true)); }),
        error_of([] { pinned_host_allocator(); })}) {
    EXPECT_NE(message.find("pinned host memory needs a CUDA device, but " + reason), std::string::npos) << message;
  }
  EXPECT_EQ(pinned_memory_stats().reserved_bytes, 0);
}

#if DPE_WITH_CUDA
class PinnedMemoryCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(PinnedMemoryCudaTest, PinMemoryCopiesIntoPinnedStorage) {
  Tensor host = arange(600).reshape({20, 30});
  Tensor pinned = host.pin_memory();
  EXPECT_TRUE(pinned.is_pinned());
  EXPECT_FALSE(host.is_pinned());
  EXPECT_TRUE(equal(pinned, host));
  EXPECT_TRUE(pinned.pin_memory().is_same(pinned));  // already pinned: itself
  EXPECT_TRUE(pinned.narrow(0, 5, 3).is_pinned());   // views share the pinned storage
  EXPECT_GE(pinned_memory_stats().allocated_bytes, static_cast<int64_t>(pinned.nbytes()));
  // Differentiable, like to(): the gradient passes through.
  Tensor leaf = ones({4}).set_requires_grad(true);
  sum(leaf.pin_memory() * 3.0).backward();
  EXPECT_TRUE(equal(leaf.grad(), full({4}, 3.0)));
}

TEST_F(PinnedMemoryCudaTest, PinnedMemoryIsForCpuTensorsOnly) {
  Tensor on_gpu = ones({3}, TensorOptions().with_device(Device::cuda(0)));
  EXPECT_NE(error_of([&] { on_gpu.pin_memory(); }).find("only CPU tensors can be pinned; this tensor is on cuda:0"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tensor::empty({3}, TensorOptions(Device::cuda(0)).with_pinned_memory(true)); })
                .find("needs a CPU device, got cuda:0"),
            std::string::npos);
}

TEST_F(PinnedMemoryCudaTest, NonBlockingCopiesFromPinnedMemoryArriveInStreamOrder) {
  Generator gen(3);
  for (int64_t n : {1, 1000, 1 << 22}) {
    Tensor host = randn({n}, {}, &gen);
    Tensor pinned = host.pin_memory();
    Tensor on_gpu = pinned.to(Device::cuda(0), /*non_blocking=*/true);
    // A kernel enqueued after the copy sees its data; the result comes back synchronously.
    EXPECT_TRUE(equal((on_gpu * 2.0).to(Device::cpu(0)), host * 2.0)) << n;
    // A chunk (a view into the pinned block, not its start) goes the same way.
    Tensor chunk = pinned.narrow(0, n / 2, n - n / 2);
    EXPECT_TRUE(equal(chunk.to(Device::cuda(0), true).to(Device::cpu(0)), host.narrow(0, n / 2, n - n / 2)));
  }
}

// The stream is held by a host callback, so the non_blocking copy cannot have run when the pinned source is
// freed; the allocator must not hand that block out until the stream is released and the copy done.
TEST_F(PinnedMemoryCudaTest, ABlockAStalledCopyStillReadsIsNotReused) {
  constexpr int64_t n = 1 << 16;
  const TensorOptions pinned_options = TensorOptions().with_pinned_memory(true);
  {
    // Warm both caches first, so that nothing below calls cudaHostAlloc or cudaMalloc while the stream is held.
    std::vector<Tensor> warm;
    for (int i = 0; i < 6; ++i) warm.push_back(Tensor::empty({n}, pinned_options));
    warm.push_back(Tensor::empty({n}, TensorOptions(Device::cuda(0))));
  }
  std::atomic<bool> release{false};
  auto wait_for_release = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) {
    }
  };
  {
    cuda::DeviceGuard guard(0);
    ASSERT_EQ(cudaLaunchHostFunc(cuda::stream(0), wait_for_release, &release), cudaSuccess);
  }
  struct Release {
    std::atomic<bool>* flag;
    ~Release() { flag->store(true); }  // never leave the stream held, even when an assertion fails
  } release_on_exit{&release};

  Tensor on_gpu;
  const void* first_block = nullptr;
  {
    Tensor pinned = full({n}, 7.0).pin_memory();
    first_block = pinned.storage()->data();
    on_gpu = pinned.to(Device::cuda(0), /*non_blocking=*/true);
  }  // the only handle to the pinned source is gone while the copy waits behind the callback
  std::vector<Tensor> keep;
  for (int i = 0; i < 5; ++i) {
    keep.push_back(Tensor::empty({n}, pinned_options));
    EXPECT_NE(keep.back().storage()->data(), first_block) << "the block under the stalled copy was handed out";
    keep.back().fill_(-1.0);  // would corrupt the copy if this were its block
  }

  release.store(true);
  cuda::synchronize(0);
  EXPECT_TRUE(equal(on_gpu.to(Device::cpu(0)), full({n}, 7.0)));  // the copy read the original values
  keep.clear();
  bool reused = false;  // once the copy is done the block is reusable again
  for (int i = 0; i < 7 && !reused; ++i) {
    keep.push_back(Tensor::empty({n}, pinned_options));
    reused = keep.back().storage()->data() == first_block;
  }
  EXPECT_TRUE(reused);
}
#endif

}  // namespace
}  // namespace dpe
