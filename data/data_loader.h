// DataLoader: PyTorch's torch.utils.data.DataLoader over two in-memory tensors, with one background thread
// that assembles batches ahead of the training loop.
//
//   data::DataLoader loader(train.images, train.labels, {.batch_size = 256, .seed = 42});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.begin_epoch(epoch);                        // new order each epoch (DistributedSampler::set_epoch)
//     while (std::optional<data::Batch> batch = loader.next()) {
//       dp.train_step(batch->inputs, batch->targets);   // the GLOBAL batch: DataParallel splits it
//     }
//   }
//
// Order: DistributedSampler with num_replicas = 1, rank = 0 (data/distributed_sampler.h): 0..N-1, or with
// shuffle a permutation that is a pure function of (seed, epoch). Batch b holds order[b*B : (b+1)*B]; the last
// batch is smaller unless drop_last drops it. num_batches() = drop_last ? N / B : ceil(N / B).
//
// Padding (pad_last_to_multiple = m > 1, without drop_last): a last batch of r < B samples is padded to
// ceil(r / m) * m samples by repeating the epoch's order from its start (order[0], order[1], ..., wrapping
// around as many times as needed when the data set is smaller than the padding): DistributedSampler's
// padding rule applied to the last global batch. The point: DDP needs every replica to get a sample, and a
// batch of k * m samples splits into m equal shards under the chunk rule (scatter_gather/chunking.h), so
// m = the number of devices makes every last batch trainable. Only the last batch changes; it can exceed B
// (by less than m) only when B is not a multiple of m. Some samples are then seen twice in that epoch.
//
// Batches: inputs (B, ...) and targets (B, ...) with the row shapes, dtypes and device of the loader's
// tensors (CPU only), gathered by index into fresh contiguous tensors that do not require grad.
//
// Threading contract (see docs/DATA.md):
//  - begin_epoch() starts one producer thread for the epoch. It gathers batches in order and keeps at most
//    `prefetch` finished batches in a bounded queue; next() takes them out in order, blocking while the
//    queue is empty. prefetch = 0 uses no thread: next() gathers the batch itself.
//  - Clean shutdown: begin_epoch() on an unfinished epoch, and the destructor, stop the producer (it checks
//    between batches and while waiting for room in the queue) and join it; neither can hang on a full queue.
//  - Errors: an exception thrown on the producer thread (by the gather or by `transform`) is delivered by
//    next() in the batch's place, after the batches before it; the epoch then ends (next() returns nullopt).
//  - One consumer: begin_epoch() and next() must be called from one thread at a time (any thread). The
//    loader's tensors must not be modified while an epoch runs (the producer reads them).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "core/tensor.h"
#include "data/distributed_sampler.h"

namespace dpe::data {

struct Batch {
  Tensor inputs;      // (B, ...) rows of the loader's inputs
  Tensor targets;     // (B, ...) the same rows of its targets
  int64_t index = 0;  // position in the epoch, 0 <= index < num_batches()
};

struct DataLoaderOptions {
  int64_t batch_size = 1;  // B >= 1: the global batch
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;  // drop the last batch when it has fewer than batch_size samples
  // m >= 0; m > 1 pads a short last batch to a multiple of m (see the file comment); 0 and 1 do not pad.
  // Has no effect with drop_last (the short batch is dropped instead).
  int64_t pad_last_to_multiple = 0;
  int prefetch = 2;        // batches assembled ahead by the producer thread, >= 0 (0: no thread)
  // Batches in pinned (page-locked) host memory (core/pinned_memory.h): the producer thread gathers rows
  // straight into pinned blocks (and pins what the transform returns), so that the step's copies to CUDA
  // devices are DMA transfers that can run asynchronously (Tensor::to(device, non_blocking=true); DataParallel
  // scatters that way). Without a CUDA device it warns once on stderr and batches stay pageable, like PyTorch.
  bool pin_memory = false;
  // Optional, run on the producer thread on every batch after the gather (e.g. augmentation or a dtype
  // conversion); what it throws reaches the consumer through next().
  std::function<void(Batch&)> transform;
};

class DataLoader {
 public:
  // inputs: (N, ...)  targets: (N, ...), on a CPU device, same N. Throws dpe::Error on bad arguments.
  DataLoader(Tensor inputs, Tensor targets, DataLoaderOptions options);
  ~DataLoader();  // stops and joins the producer thread, dropping unread batches
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts epoch `epoch` (reshuffles when shuffle), abandoning an unfinished one.
  void begin_epoch(int64_t epoch);
  // The next batch of the current epoch; nullopt when it is over. Rethrows a producer exception.
  // Throws if begin_epoch() was never called.
  std::optional<Batch> next();

  int64_t num_batches() const;
  // Samples in the last batch of an epoch (after padding; batch_size with drop_last); 0 when num_batches() = 0.
  int64_t last_batch_size() const { return last_batch_size_; }
  int64_t dataset_size() const { return sampler_.dataset_size(); }
  const DataLoaderOptions& options() const { return options_; }
  // True when batches are in pinned memory: pin_memory was asked for and a CUDA device is visible.
  bool pins_memory() const { return pin_; }

 private:
  // order: the epoch's order, padded (num_batches() - 1) * B + last_batch_size() indices long when padding
  // applies, else the sampler's N indices.
  Batch assemble(int64_t batch_index, const std::vector<int64_t>& order) const;
  void produce(std::vector<int64_t> order);  // the producer thread's body
  void stop();                               // cancels and joins the producer, clears the queue

  Tensor inputs_;
  Tensor targets_;
  DataLoaderOptions options_;
  bool pin_ = false;
  DistributedSampler sampler_;
  int64_t last_batch_size_ = 0;  // fixed by the constructor (see last_batch_size())

  // The current epoch.
  bool started_ = false;
  int64_t next_index_ = 0;       // the next batch next() returns
  std::vector<int64_t> order_;   // prefetch = 0 only: the epoch's sample order

  // Shared with the producer thread, under mutex_.
  std::mutex mutex_;
  std::condition_variable cv_;   // queue changed, or cancel_ set
  std::deque<Batch> queue_;      // at most max(prefetch, 1) batches
  std::exception_ptr error_;     // the producer's exception, delivered after the queued batches
  bool producer_done_ = false;   // the producer has pushed its last batch (or its error)
  bool cancel_ = false;
  std::thread producer_;
};

}  // namespace dpe::data
