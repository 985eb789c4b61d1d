#include "data/data_loader.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/pinned_memory.h"

namespace dpe::data {
namespace {

// A CPU tensor with at least one dimension, cut off from autograd and made contiguous (row gathers are
// then memcpys of whole rows).
Tensor prepare(const Tensor& t, const char* name) {
  DPE_CHECK(t.defined(), "DataLoader: ", name, " is an undefined tensor");
  DPE_CHECK(t.dim() >= 1, "DataLoader: ", name, " must have a sample dimension; got a 0-dim tensor");
  DPE_CHECK(t.device().is_cpu(), "DataLoader: ", name, " is on ", t.device(),
            "; expected a CPU tensor (batches are gathered on the host; move each batch to the GPU instead)");
  return t.detach().contiguous();
}

// rows of `src` (N, ...) listed in idx -> a new (idx.size(), ...) tensor on src's device.
Tensor gather_rows(const Tensor& src, const int64_t* idx, int64_t count, bool pinned) {
  Shape shape = src.shape();
  const int64_t n = shape[0];
  shape[0] = count;
  Tensor out = Tensor::empty(shape, TensorOptions(src.dtype()).with_device(src.device()).with_pinned_memory(pinned));
  if (count == 0 || out.nbytes() == 0) return out;
  const size_t row_bytes = src.nbytes() / static_cast<size_t>(n);
  const auto* from = static_cast<const uint8_t*>(src.data_ptr());
  auto* to = static_cast<uint8_t*>(out.data_ptr());
  for (int64_t i = 0; i < count; ++i) {
    DPE_INTERNAL_ASSERT(idx[i] >= 0 && idx[i] < n, "index ", idx[i], " of ", n);
    std::memcpy(to + i * row_bytes, from + idx[i] * row_bytes, row_bytes);
  }
  return out;
}

}  // namespace

DataLoader::DataLoader(Tensor inputs, Tensor targets, DataLoaderOptions options)
    : inputs_(prepare(inputs, "inputs")),
      targets_(prepare(targets, "targets")),
      options_(std::move(options)),
      pin_(options_.pin_memory && pinned_memory_available()),
      sampler_(inputs_.size(0), {.num_replicas = 1, .rank = 0, .shuffle = options_.shuffle,
                                 .seed = options_.seed, .drop_last = false}) {
  DPE_CHECK(inputs_.size(0) == targets_.size(0), "DataLoader: inputs have ", inputs_.size(0),
            " samples (shape ", shape_str(inputs_.shape()), ") but targets have ", targets_.size(0),
            " (shape ", shape_str(targets_.shape()), "); expected the same number");
  DPE_CHECK(options_.batch_size >= 1, "DataLoader: batch_size ", options_.batch_size,
            " is invalid; expected batch_size >= 1");
  DPE_CHECK(options_.prefetch >= 0, "DataLoader: prefetch ", options_.prefetch,
            " is invalid; expected prefetch >= 0 (0: no background thread)");
  DPE_CHECK(options_.pad_last_to_multiple >= 0, "DataLoader: pad_last_to_multiple ", options_.pad_last_to_multiple,
            " is invalid; expected >= 0 (0 or 1: no padding)");
  const int64_t n = dataset_size(), b = options_.batch_size, m = options_.pad_last_to_multiple;
  if (options_.drop_last) {
    last_batch_size_ = n >= b ? b : 0;
  } else if (n > 0) {
    last_batch_size_ = n - (num_batches() - 1) * b;  // in [1, b]
    if (last_batch_size_ < b && m > 1) last_batch_size_ = (last_batch_size_ + m - 1) / m * m;
  }
  if (options_.pin_memory && !pin_) {
    std::fprintf(stderr, "dpe DataLoader: pin_memory=true, but pinned host memory needs a CUDA device and %s; "
                 "batches stay in pageable memory\n", pinned_memory_unavailable_reason().c_str());
  }
}

DataLoader::~DataLoader() { stop(); }

int64_t DataLoader::num_batches() const {
  const int64_t n = dataset_size();
  const int64_t b = options_.batch_size;
  return options_.drop_last ? n / b : n / b + (n % b != 0 ? 1 : 0);
}

void DataLoader::begin_epoch(int64_t epoch) {
  stop();
  sampler_.set_epoch(epoch);
  std::vector<int64_t> order = sampler_.indices();  // (N): num_replicas = 1, so every index once
  const int64_t n = dataset_size();
  const int64_t padded = num_batches() == 0 ? 0 : (num_batches() - 1) * options_.batch_size + last_batch_size_;
  // Padding: repeat the order from its start, wrapping around when it is shorter than the padding.
  for (int64_t i = 0; n > 0 && static_cast<int64_t>(order.size()) < padded; ++i) order.push_back(order[i % n]);
  started_ = true;
  next_index_ = 0;
  if (options_.prefetch == 0) {
    order_ = std::move(order);
  } else {
    producer_ = std::thread(&DataLoader::produce, this, std::move(order));
  }
}

std::optional<Batch> DataLoader::next() {
  DPE_CHECK(started_, "DataLoader::next: no epoch started; call begin_epoch(epoch) first");
  if (next_index_ >= num_batches()) return std::nullopt;

  if (options_.prefetch == 0) {
    const int64_t index = next_index_;
    next_index_ = num_batches();  // an exception below ends the epoch, as on the producer thread
    Batch batch = assemble(index, order_);
    next_index_ = index + 1;
    return batch;
  }

  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return !queue_.empty() || producer_done_; });
  if (!queue_.empty()) {
    Batch batch = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    cv_.notify_all();  // room for the producer
    DPE_INTERNAL_ASSERT(batch.index == next_index_, "batch ", batch.index, " arrived, expected ", next_index_);
    ++next_index_;
    return batch;
  }
  next_index_ = num_batches();  // the producer is done: the epoch is over, with or without an error
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  DPE_INTERNAL_ASSERT(false, "the producer finished without delivering every batch");
  return std::nullopt;
}

Batch DataLoader::assemble(int64_t batch_index, const std::vector<int64_t>& order) const {
  // order: (N, or more when padded)  batch: order[start : start + count]
  const int64_t start = batch_index * options_.batch_size;
  const int64_t count = batch_index == num_batches() - 1 ? last_batch_size_ : options_.batch_size;
  DPE_INTERNAL_ASSERT(count >= 1 && start + count <= static_cast<int64_t>(order.size()), "batch ", batch_index,
                      " of ", count, " samples at ", start, " in an order of ", order.size());
  Batch batch{.inputs = gather_rows(inputs_, order.data() + start, count, pin_),
              .targets = gather_rows(targets_, order.data() + start, count, pin_),
              .index = batch_index};
  if (options_.transform) options_.transform(batch);
  if (pin_) {  // what the transform made is pinned too (a no-op for the gathered, already pinned tensors)
    for (Tensor* t : {&batch.inputs, &batch.targets}) {
      if (t->defined() && t->device().is_cpu()) *t = t->pin_memory();
    }
  }
  return batch;
}

void DataLoader::produce(std::vector<int64_t> order) {
  const int64_t batches = num_batches();
  const size_t capacity = static_cast<size_t>(options_.prefetch);
  try {
    for (int64_t b = 0; b < batches; ++b) {
      {
        // Wait for room first, so that at most `prefetch` finished batches exist ahead of the consumer.
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return queue_.size() < capacity || cancel_; });
        if (cancel_) return;
      }
      Batch batch = assemble(b, order);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (cancel_) return;
        queue_.push_back(std::move(batch));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    producer_done_ = true;
  }
  cv_.notify_all();
}

void DataLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancel_ = true;
  }
  cv_.notify_all();
  if (producer_.joinable()) producer_.join();
  // The producer has exited: nothing else touches the shared state.
  queue_.clear();
  error_ = nullptr;
  producer_done_ = false;
  cancel_ = false;
  order_.clear();
  started_ = false;
}

}  // namespace dpe::data
