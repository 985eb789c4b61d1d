// DataParallelOptions::on_device_failure: surviving a replica's failure inside the step API. A failed step
// has run no optimizer, so the parameters are where the step found them (DP: the master's; DDP: every
// replica's, identical); what the failed step changed is undone here (buffers restored, gradients dropped),
// the engine is rebuilt over what is left, and forward_backward redoes the same step.
//
// A replica that does not arrive at a collective within the group's timeout is dropped too: the partner that
// timed out reports first, and the group names who it waited for.
// A replica stuck for good (in a kernel, a wait) is declared lost by the worker pool's straggler timeout and
// dropped like a failed one; its thread is left behind with everything it may still reach kept alive
// (abandon_to_lost_workers). Not covered (docs/DATA_PARALLEL.md "A failed device"): failures across
// processes; a step onto gradients accumulated by earlier backwards (no_sync, or forward_backward without
// zero_grad), which cannot be redone exactly.
#include <algorithm>
#include <memory>
#include <mutex>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "engine/data_parallel.h"
#include "engine/ddp_reducer.h"
#include "engine/gradient_reducer.h"
#include "engine/worker_pool.h"

namespace dpe {

namespace {

// What lost workers may still reach, never destroyed: their threads may wake at any time (Note [Lost workers]).
void keep_forever(std::shared_ptr<void> object) {
  static auto* mutex = new std::mutex;
  static auto* kept = new std::vector<std::shared_ptr<void>>;
  if (!object) return;
  std::lock_guard lock(*mutex);
  kept->push_back(std::move(object));
}

bool is_out_of_memory(const std::string& message) { return message.find("out of memory") != std::string::npos; }

template <typename T>
void erase_at(std::vector<T>& v, size_t i) {
  v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
}

}  // namespace

std::string DataParallel::recover(const ReplicaError& failure, const std::vector<Tensor>& buffers, bool accumulated) {
  size_t r = static_cast<size_t>(failure.replica());
  // A collective timeout (DDP's all-reduce, DP's reduction in shares) is reported first by a partner that
  // waited; the device to drop is the one that did not arrive (it failed later, if at all, with the abort).
  std::string cause;
  if (std::string(failure.what()).find(" timed out after ") != std::string::npos) {
    std::vector<int> missing;
    if (options_.mode == ParallelMode::DP && reducer_) missing = reducer_->missing_at_last_timeout();
    if (options_.mode == ParallelMode::DDP && group_) missing = group_->missing_at_last_timeout();
    if (missing.size() == 1) {
      r = static_cast<size_t>(missing[0]);
      cause = "it did not arrive in time: ";
    }
  }
  const Device device = device_ids_[r];
  const bool oom = is_out_of_memory(failure.what());
  auto cannot = [&](const std::string& why) {
    throw ReplicaError(failure.replica(), failure.device(),
                       detail::str_cat(failure.message(), " (on_device_failure could not recover: ", why, ")"),
                       failure.later_failures());
  };
  const DeviceFailurePolicy policy = options_.on_device_failure;
  // Lost workers (stuck past the straggler timeout) are dropped whatever failed first.
  const std::vector<size_t> lost = pool_->lost_workers();
  if (!lost.empty() && policy == DeviceFailurePolicy::RetrySmallerChunk) {
    cannot("a device is lost (stuck), and retry_smaller_chunk only handles out-of-memory errors");
  }
  if (policy == DeviceFailurePolicy::RetrySmallerChunk && !oom) throw;
  if (spans_processes(options_.backend)) cannot("the group spans processes");
  if (accumulated) cannot("gradients accumulated before this step would be lost");
  NoGradGuard no_grad;
  // Not a lost replica's gradients: its thread may still be writing them (Note [Lost workers]); it is dropped
  // below.
  for (size_t i = 0; i < replicas_.size(); ++i) {
    if (std::find(lost.begin(), lost.end(), i) == lost.end()) replicas_[i]->zero_grad();
  }
  std::string done;
  if (policy == DeviceFailurePolicy::RetrySmallerChunk) {
    if (options_.deterministic) cannot("the deterministic mode's virtual shards do not shrink");
    // The device keeps its place with half its share: the split becomes weighted by the shares it had.
    std::vector<int64_t> shares = report_.chunk_sizes;
    shares.resize(device_ids_.size(), 0);
    if (shares[r] <= 1) cannot(detail::str_cat(device, " ran out of memory with ", shares[r], " sample(s)"));
    std::vector<double> weights(shares.begin(), shares.end());
    weights[r] = static_cast<double>(shares[r] / 2);
    options_.split = SplitRule::Weighted;
    options_.split_weights = weights;
    auto_split_.reset();
    done = detail::str_cat(device, " (replica ", r, ") ran out of memory with ", shares[r], " samples; the step was "
                           "redone with ", shares[r] / 2, " there");
  } else {
    std::vector<size_t> dropped = lost;
    if (std::find(dropped.begin(), dropped.end(), r) == dropped.end()) dropped.push_back(r);
    std::sort(dropped.begin(), dropped.end());
    if (dropped.size() >= device_ids_.size()) cannot("it was the last device");
    if (options_.mode == ParallelMode::DP && dropped[0] == 0) {
      cannot(detail::str_cat("DP's master is on ", device_ids_[0]));
    }
    std::string names;
    for (size_t d : dropped) {
      names += detail::str_cat(names.empty() ? "" : ", ", device_ids_[d], " (replica ", d, ")");
    }
    for (auto it = dropped.rbegin(); it != dropped.rend(); ++it) drop_device(*it);
    done = detail::str_cat("dropped ", names, ": ", cause, failure.what(), "; the step was redone on ",
                           device_ids_.size(), " device(s) from ", device_ids_[0]);
  }
  // Undo the failed step's buffer updates (BatchNorm running statistics): every replica from replica 0's.
  for (auto& replica_buffers : replica_buffers_) {
    for (size_t b = 0; b < buffers.size(); ++b) replica_buffers[b].copy_(buffers[b]);
  }
  return done;
}

std::unique_ptr<DeviceWorkerPool> DataParallel::make_pool() const {
  return std::make_unique<DeviceWorkerPool>(device_ids_, options_.deterministic ? 1 : 0, options_.timeout);
}

void DataParallel::abandon_to_lost_workers() {
  if (!pool_ || !pool_->has_lost_workers()) return;
  const std::vector<size_t> lost = pool_->lost_workers();
  if (lost.empty()) return;
  for (size_t r : lost) {
    if (r < replicas_.size()) keep_forever(replicas_[r]);
    if (r < optimizers_.size()) keep_forever(std::shared_ptr<optim::Optimizer>(std::move(optimizers_[r])));
  }
  keep_forever(group_);
  keep_forever(std::shared_ptr<DdpReducer>(std::move(ddp_reducer_)));
  keep_forever(std::shared_ptr<GradientReducer>(std::move(reducer_)));
}

void DataParallel::retire(std::shared_ptr<void> object) {
  if (pool_ && pool_->has_lost_workers()) keep_forever(std::move(object));
}

void DataParallel::drop_device(size_t r) {
  const Device dropped = device_ids_[r];
  abandon_to_lost_workers();
  // The old pool first: its threads are idle (the failed task returned its exception) or lost (left behind),
  // so this joins the others.
  pool_.reset();
  ddp_reducer_.reset();
  reducer_.reset();
  // DDP's group loses the member (NCCL: ncclCommShrink, which also ends what it left in flight).
  if (group_) group_ = group_->shrink({static_cast<int>(r)});
  erase_at(device_ids_, r);
  erase_at(replicas_, r);
  erase_at(replica_state_, r);
  erase_at(replica_buffers_, r);
  erase_at(replica_params_, r);
  if (optimizers_.size() > r && options_.mode == ParallelMode::DDP) erase_at(optimizers_, r);
  options_.device_ids = device_ids_;
  if (options_.split == SplitRule::Weighted) erase_at(options_.split_weights, r);
  if (auto_split_) auto_split_ = std::make_unique<AutoSplit>(static_cast<int>(device_ids_.size()));
  if (output_device_ == dropped) output_device_ = device_ids_[0];
  pool_ = make_pool();
  if (options_.mode == ParallelMode::DDP) connect_replicas();
  build_reducer();
}

}  // namespace dpe
