#include "data/data_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/ops.h"
#include "core/pinned_memory.h"
#include "tests/testing/errors.h"

namespace dpe::data {
namespace {

using dpe::testing::error_of;
using namespace std::chrono_literals;

// inputs: (n, 2) float32, row i = [i, 1000 + i]   targets: (n) int64, target i = 7 * i
struct Data {
  Tensor inputs;
  Tensor targets;
};

Data make_data(int64_t n) {
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int64_t i = 0; i < n; ++i) {
    x.push_back(static_cast<float>(i));
    x.push_back(static_cast<float>(1000 + i));
    y.push_back(7 * i);
  }
  return {Tensor::from_vector(x, {n, 2}), Tensor::from_vector(y, {n})};
}

// The sample indices of one epoch, batch by batch, checking each batch's rows against its targets.
std::vector<std::vector<int64_t>> run_epoch(DataLoader& loader, int64_t epoch) {
  loader.begin_epoch(epoch);
  std::vector<std::vector<int64_t>> batches;
  while (std::optional<Batch> batch = loader.next()) {
    EXPECT_EQ(batch->index, static_cast<int64_t>(batches.size()));
    const int64_t b = batch->inputs.size(0);
    EXPECT_EQ(batch->inputs.shape(), (Shape{b, 2}));
    EXPECT_EQ(batch->targets.shape(), (Shape{b}));
    EXPECT_TRUE(batch->inputs.is_contiguous());
    EXPECT_FALSE(batch->inputs.requires_grad());
    const std::vector<float> x = batch->inputs.to_vector<float>();
    const std::vector<int64_t> y = batch->targets.to_vector<int64_t>();
    std::vector<int64_t> indices;
    for (int64_t r = 0; r < b; ++r) {
      const int64_t i = static_cast<int64_t>(x[2 * r]);
      EXPECT_EQ(x[2 * r + 1], 1000.0f + i);
      EXPECT_EQ(y[r], 7 * i) << "targets gathered with the inputs' indices";
      indices.push_back(i);
    }
    batches.push_back(indices);
  }
  EXPECT_FALSE(loader.next().has_value()) << "an epoch stays over";
  return batches;
}

std::vector<int64_t> flat(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

std::vector<int64_t> sizes(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> s;
  for (const auto& b : batches) s.push_back(static_cast<int64_t>(b.size()));
  return s;
}

// Runs f on its own thread and fails the test if it has not finished within `limit` (a hang).
template <typename F>
void finishes_within(std::chrono::seconds limit, F f) {
  std::promise<void> finished;
  std::future<void> done = finished.get_future();
  std::thread t([&finished, f = std::move(f)]() mutable {
    try {
      f();
      finished.set_value();
    } catch (...) {
      finished.set_exception(std::current_exception());
    }
  });
  if (done.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "did not finish within " << limit.count() << " s: the loader hangs";
    t.detach();  // cannot be joined; the test has failed
    return;
  }
  t.join();
  done.get();  // rethrows f's exception
}

TEST(DataLoader, EverySampleOncePerEpochWithPartialLastBatch) {
  Data d = make_data(10);
  for (int prefetch : {0, 1, 2, 5}) {
    SCOPED_TRACE("prefetch " + std::to_string(prefetch));
    DataLoader loader(d.inputs, d.targets, {.batch_size = 3, .seed = 1, .prefetch = prefetch});
    EXPECT_EQ(loader.num_batches(), 4);
    EXPECT_EQ(loader.dataset_size(), 10);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      auto batches = run_epoch(loader, epoch);
      EXPECT_EQ(sizes(batches), (std::vector<int64_t>{3, 3, 3, 1}));
      std::vector<int64_t> all = flat(batches);
      std::sort(all.begin(), all.end());
      std::vector<int64_t> expected(10);
      std::iota(expected.begin(), expected.end(), 0);
      EXPECT_EQ(all, expected);
    }
  }
}

TEST(DataLoader, BatchSizesAndNumBatches) {
  Data d = make_data(12);
  auto batch_sizes = [&](int64_t b, bool drop_last) {
    DataLoader loader(d.inputs, d.targets, {.batch_size = b, .drop_last = drop_last});
    auto s = sizes(run_epoch(loader, 0));
    EXPECT_EQ(static_cast<int64_t>(s.size()), loader.num_batches());
    return s;
  };
  EXPECT_EQ(batch_sizes(4, false), (std::vector<int64_t>{4, 4, 4}));      // divides evenly
  EXPECT_EQ(batch_sizes(5, false), (std::vector<int64_t>{5, 5, 2}));
  EXPECT_EQ(batch_sizes(5, true), (std::vector<int64_t>{5, 5}));          // drop_last drops the 2
  EXPECT_EQ(batch_sizes(4, true), (std::vector<int64_t>{4, 4, 4}));       // nothing to drop
  EXPECT_EQ(batch_sizes(12, false), (std::vector<int64_t>{12}));
  EXPECT_EQ(batch_sizes(100, false), (std::vector<int64_t>{12}));         // one partial batch
  EXPECT_EQ(batch_sizes(100, true), (std::vector<int64_t>{}));            // ... dropped
}

TEST(DataLoader, DropLastReadsDistinctSamples) {
  Data d = make_data(10);
  DataLoader loader(d.inputs, d.targets, {.batch_size = 3, .seed = 5, .drop_last = true});
  std::vector<int64_t> all = flat(run_epoch(loader, 0));
  ASSERT_EQ(all.size(), 9u);
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::unique(all.begin(), all.end()), all.end());
}

// pad_last_to_multiple: the short last batch is padded to a multiple of m with the epoch's first samples
// (DistributedSampler's rule), wrapping around when the data set is smaller than the padding.
TEST(DataLoader, PadLastBatchToAMultiple) {
  auto epoch_of = [](int64_t n, int64_t b, int64_t m, bool drop_last = false, int prefetch = 2) {
    Data d = make_data(n);
    DataLoader loader(d.inputs, d.targets,
                      {.batch_size = b, .shuffle = false, .drop_last = drop_last, .pad_last_to_multiple = m,
                       .prefetch = prefetch});
    auto batches = run_epoch(loader, 0);
    EXPECT_EQ(static_cast<int64_t>(batches.size()), loader.num_batches());
    if (!batches.empty()) {
      EXPECT_EQ(static_cast<int64_t>(batches.back().size()), loader.last_batch_size());
    }
    return batches;
  };
  using Batches = std::vector<std::vector<int64_t>>;
  // 23 samples, batch 7, 3 devices: the last batch of 2 becomes 3 (sample 0 again): 3 shards of 1.
  Batches b = epoch_of(23, 7, 3);
  EXPECT_EQ(sizes(b), (std::vector<int64_t>{7, 7, 7, 3}));
  EXPECT_EQ(b.back(), (std::vector<int64_t>{21, 22, 0}));
  for (int prefetch : {0, 1}) EXPECT_EQ(epoch_of(23, 7, 3, false, prefetch), b) << "prefetch " << prefetch;
  // A full last batch, m = 0 and m = 1 change nothing.
  EXPECT_EQ(sizes(epoch_of(21, 7, 3)), (std::vector<int64_t>{7, 7, 7}));
  EXPECT_EQ(sizes(epoch_of(23, 7, 0)), (std::vector<int64_t>{7, 7, 7, 2}));
  EXPECT_EQ(sizes(epoch_of(23, 7, 1)), (std::vector<int64_t>{7, 7, 7, 2}));
  // drop_last wins: the short batch is dropped, not padded.
  EXPECT_EQ(sizes(epoch_of(23, 7, 3, true)), (std::vector<int64_t>{7, 7, 7}));
  // The last batch can exceed the batch size when B is not a multiple of m: 6 of batch 7 -> 8 for m = 4.
  EXPECT_EQ(epoch_of(13, 7, 4).back(), (std::vector<int64_t>{7, 8, 9, 10, 11, 12, 0, 1}));
  // Fewer samples than the padding: the order wraps around as often as needed (2 samples -> 5).
  EXPECT_EQ(epoch_of(2, 8, 5), (Batches{{0, 1, 0, 1, 0}}));
  EXPECT_EQ(epoch_of(0, 8, 5), Batches{});
}

TEST(DataLoader, PaddingRepeatsTheShuffledOrderFromItsStart) {
  Data d = make_data(10);
  DataLoader plain(d.inputs, d.targets, {.batch_size = 4, .seed = 9});
  DataLoader padded(d.inputs, d.targets, {.batch_size = 4, .seed = 9, .pad_last_to_multiple = 3});
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> order = flat(run_epoch(plain, epoch));
    auto batches = run_epoch(padded, epoch);
    ASSERT_EQ(sizes(batches), (std::vector<int64_t>{4, 4, 3}));
    std::vector<int64_t> expected = order;
    expected.push_back(order[0]);  // the shuffled order's first sample, as DistributedSampler pads
    EXPECT_EQ(flat(batches), expected);
  }
}

TEST(DataLoader, WithoutShuffleInOrder) {
  Data d = make_data(7);
  DataLoader loader(d.inputs, d.targets, {.batch_size = 3, .shuffle = false});
  EXPECT_EQ(run_epoch(loader, 0), (std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {6}}));
  EXPECT_EQ(run_epoch(loader, 1), (std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {6}}));
}

TEST(DataLoader, ShuffleDiffersAcrossEpochsAndIsReproducible) {
  Data d = make_data(50);
  const DataLoaderOptions options{.batch_size = 8, .seed = 42};
  DataLoader a(d.inputs, d.targets, options);
  DataLoader b(d.inputs, d.targets, options);
  const std::vector<int64_t> a0 = flat(run_epoch(a, 0));
  const std::vector<int64_t> a1 = flat(run_epoch(a, 1));
  EXPECT_NE(a0, a1) << "a new order every epoch";
  EXPECT_EQ(flat(run_epoch(b, 1)), a1) << "same (seed, epoch), same order, in any loader";
  EXPECT_EQ(flat(run_epoch(b, 0)), a0);
  EXPECT_EQ(flat(run_epoch(a, 0)), a0) << "an epoch can be replayed";

  // The order is DistributedSampler's with one replica (PyTorch's set_epoch semantics).
  DistributedSampler sampler(50, {.num_replicas = 1, .rank = 0, .seed = 42});
  sampler.set_epoch(1);
  EXPECT_EQ(a1, sampler.indices());

  DataLoader other_seed(d.inputs, d.targets, {.batch_size = 8, .seed = 43});
  EXPECT_NE(flat(run_epoch(other_seed, 0)), a0);
  // Prefetching does not change the order.
  DataLoader sync(d.inputs, d.targets, {.batch_size = 8, .seed = 42, .prefetch = 0});
  EXPECT_EQ(flat(run_epoch(sync, 1)), a1);
}

TEST(DataLoader, RowsOfAnyShapeAndDtype) {
  // inputs: (6, 2, 3) uint8   targets: (6, 2) float64
  std::vector<uint8_t> x(36);
  std::iota(x.begin(), x.end(), uint8_t{0});
  std::vector<double> y(12);
  std::iota(y.begin(), y.end(), 0.5);
  DataLoader loader(Tensor::from_vector(x, {6, 2, 3}), Tensor::from_vector(y, {6, 2}),
                    {.batch_size = 4, .shuffle = false});
  loader.begin_epoch(0);
  std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->inputs.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(batch->inputs.dtype(), DType::UInt8);
  EXPECT_EQ(batch->targets.shape(), (Shape{4, 2}));
  EXPECT_EQ(batch->targets.to_vector<double>(), std::vector<double>(y.begin(), y.begin() + 8));
  batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->inputs.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(batch->inputs.to_vector<uint8_t>(), std::vector<uint8_t>(x.begin() + 24, x.end()));
}

TEST(DataLoader, NonContiguousAndGradInputs) {
  // inputs: the transpose of a (2, 5) tensor, so rows are not contiguous in memory.
  Tensor base = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 10, 11, 12, 13, 14}, {2, 5});
  base.set_requires_grad(true);
  DataLoader loader(base.t(), Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4}, {5}),
                    {.batch_size = 2, .shuffle = false});
  loader.begin_epoch(0);
  Batch batch = *loader.next();
  EXPECT_EQ(batch.inputs.to_vector<float>(), (std::vector<float>{0, 10, 1, 11}));
  EXPECT_FALSE(batch.inputs.requires_grad());
}

TEST(DataLoader, EmptyDataset) {
  Data d = make_data(0);
  DataLoader loader(d.inputs, d.targets, {.batch_size = 4});
  EXPECT_EQ(loader.num_batches(), 0);
  EXPECT_TRUE(run_epoch(loader, 0).empty());
}

TEST(DataLoader, PrefetchIsBounded) {
  Data d = make_data(100);
  std::atomic<int> assembled{0};
  DataLoader loader(d.inputs, d.targets,
                    {.batch_size = 1, .prefetch = 3, .transform = [&](Batch&) { ++assembled; }});
  loader.begin_epoch(0);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (assembled < 3 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(50ms);  // time to overrun the bound, if it could
  EXPECT_EQ(assembled.load(), 3) << "the producer runs prefetch batches ahead, no further";
  ASSERT_TRUE(loader.next().has_value());
  while (assembled < 4 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(assembled.load(), 4) << "one taken, one more made";
}

TEST(DataLoader, ProducerExceptionReachesTheConsumerInOrder) {
  Data d = make_data(10);
  for (int prefetch : {0, 2}) {
    SCOPED_TRACE("prefetch " + std::to_string(prefetch));
    DataLoader loader(d.inputs, d.targets,
                      {.batch_size = 2, .prefetch = prefetch, .transform = [](Batch& b) {
                         DPE_CHECK(b.index != 2, "augmentation failed on batch ", b.index);
                       }});
    loader.begin_epoch(0);
    EXPECT_EQ(loader.next()->index, 0);
    EXPECT_EQ(loader.next()->index, 1);
    EXPECT_TRUE(error_of([&] { loader.next(); }).starts_with("augmentation failed on batch 2 ("));
    EXPECT_FALSE(loader.next().has_value()) << "the epoch ends at the error";
    // The next epoch starts afresh (and fails at the same batch again).
    loader.begin_epoch(1);
    EXPECT_EQ(loader.next()->index, 0);
  }
}

TEST(DataLoader, ProducerExceptionKeepsItsType) {
  Data d = make_data(4);
  DataLoader loader(d.inputs, d.targets,
                    {.batch_size = 2, .transform = [](Batch&) { throw std::out_of_range("not a dpe error"); }});
  loader.begin_epoch(0);
  EXPECT_THROW(loader.next(), std::out_of_range);
}

TEST(DataLoader, EarlyDestructionDoesNotHang) {
  Data d = make_data(1000);
  // Destroyed with a full queue and the producer waiting for room, after reading one batch.
  finishes_within(30s, [&] {
    DataLoader loader(d.inputs, d.targets, {.batch_size = 1, .prefetch = 2});
    loader.begin_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
    std::this_thread::sleep_for(20ms);  // let the producer fill the queue and block
  });
  // Destroyed without reading anything, while the producer is still starting.
  finishes_within(30s, [&] {
    DataLoader loader(d.inputs, d.targets, {.batch_size = 7, .prefetch = 1});
    loader.begin_epoch(0);
  });
  // Never started.
  finishes_within(30s, [&] { DataLoader loader(d.inputs, d.targets, {.batch_size = 7}); });
  // Destroyed while a slow transform runs on the producer thread.
  finishes_within(30s, [&] {
    DataLoader loader(d.inputs, d.targets,
                      {.batch_size = 10, .transform = [](Batch&) { std::this_thread::sleep_for(5ms); }});
    loader.begin_epoch(0);
    loader.next();
  });
}

TEST(DataLoader, AbandonedEpochsDoNotHang) {
  Data d = make_data(1000);
  finishes_within(30s, [&] {
    DataLoader loader(d.inputs, d.targets, {.batch_size = 3, .prefetch = 2});
    for (int64_t epoch = 0; epoch < 50; ++epoch) {
      loader.begin_epoch(epoch);  // abandons the previous epoch mid-way
      for (int i = 0; i < epoch % 4; ++i) ASSERT_TRUE(loader.next().has_value());
    }
    // A full epoch after all that still has every sample.
    std::vector<int64_t> all = flat(run_epoch(loader, 99));
    EXPECT_EQ(all.size(), 1000u);
  });
}

TEST(DataLoader, BadArguments) {
  Data d = make_data(10);
  Data short_targets = make_data(9);
  EXPECT_NE(error_of([&] { DataLoader(d.inputs, short_targets.targets, {.batch_size = 2}); })
                .find("inputs have 10 samples (shape [10, 2]) but targets have 9 (shape [9])"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DataLoader(d.inputs, d.targets, {.batch_size = 0}); })
                .find("batch_size 0 is invalid"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DataLoader(d.inputs, d.targets, {.batch_size = 2, .prefetch = -1}); })
                .find("prefetch -1 is invalid"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DataLoader(d.inputs, d.targets, {.batch_size = 2, .pad_last_to_multiple = -3}); })
                .find("pad_last_to_multiple -3 is invalid; expected >= 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DataLoader(Tensor::from_vector(std::vector<float>{1}, {}), d.targets, {}); })
                .find("inputs must have a sample dimension"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DataLoader(Tensor(), d.targets, {}); }).find("inputs is an undefined tensor"),
            std::string::npos);
  DataLoader loader(d.inputs, d.targets, {.batch_size = 2});
  EXPECT_NE(error_of([&] { loader.next(); }).find("call begin_epoch(epoch) first"), std::string::npos);
}

TEST(DataLoader, PinMemoryWithoutCudaWarnsOnceAndKeepsBatchesPageable) {
  if (pinned_memory_available()) GTEST_SKIP() << "a CUDA device is visible";
  Data d = make_data(5);
  ::testing::internal::CaptureStderr();
  DataLoader loader(d.inputs, d.targets, {.batch_size = 2, .shuffle = false, .pin_memory = true});
  const std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find("pin_memory=true, but pinned host memory needs a CUDA device and " +
                         pinned_memory_unavailable_reason() + "; batches stay in pageable memory"),
            std::string::npos)
      << warning;
  EXPECT_FALSE(loader.pins_memory());
  loader.begin_epoch(0);
  EXPECT_FALSE(loader.next()->inputs.is_pinned());
  EXPECT_EQ(flat(run_epoch(loader, 0)), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(DataLoader, PinMemoryGivesPinnedBatchesEvenAfterATransform) {
  if (!pinned_memory_available()) GTEST_SKIP() << "no CUDA device: " << pinned_memory_unavailable_reason();
  Data d = make_data(7);
  for (bool transform : {false, true}) {
    DataLoaderOptions options{.batch_size = 3, .shuffle = false, .pin_memory = true};
    if (transform) options.transform = [](Batch& b) { b.inputs = b.inputs.to(DType::Float64); };  // a new, pageable tensor
    DataLoader loader(d.inputs, d.targets, options);
    EXPECT_TRUE(loader.pins_memory());
    loader.begin_epoch(0);
    int64_t first = 0;
    while (std::optional<Batch> batch = loader.next()) {
      EXPECT_TRUE(batch->inputs.is_pinned()) << transform;
      EXPECT_TRUE(batch->targets.is_pinned()) << transform;
      const int64_t b = batch->inputs.size(0);
      EXPECT_TRUE(equal(batch->inputs.to(DType::Float32), d.inputs.narrow(0, first, b)));
      EXPECT_TRUE(equal(batch->targets, d.targets.narrow(0, first, b)));
      first += b;
    }
    EXPECT_EQ(first, 7);
  }
}

}  // namespace
}  // namespace dpe::data
