// DataParallelOptions::on_device_failure: surviving a replica's failure inside the step API. A failed step
// has run no optimizer, so the parameters are where the step found them (DP: the master's; DDP: every
// replica's, identical); what the failed step changed is undone here (buffers restored, gradients dropped),
// the engine is rebuilt over what is left, and forward_backward redoes the same step.
//
// A replica that does not arrive at a collective within the group's timeout is dropped too: the partner that
// timed out reports first, and the group names who it waited for.
// Not covered (docs/DATA_PARALLEL.md "A failed device"): a thread stuck inside a kernel for good (it cannot be
// killed, and rebuilding the pool would wait for it); failures across processes; a step onto gradients accumulated
// by earlier backwards (no_sync, or forward_backward without zero_grad), which cannot be redone exactly.
#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "engine/data_parallel.h"
#include "engine/ddp_reducer.h"
#include "engine/gradient_reducer.h"
#include "engine/worker_pool.h"

namespace dpe {

namespace {

bool is_out_of_memory(const std::string& message) { return message.find("out of memory") != std::string::npos; }

template <typename T>
void erase_at(std::vector<T>& v, size_t i) {
  v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
}

}  // namespace

std::string DataParallel::recover(const ReplicaError& failure, const std::vector<Tensor>& buffers, bool accumulated) {
  size_t r = static_cast<size_t>(failure.replica());
  // A collective timeout is reported first by a partner that waited; the device to drop is the one that did
  // not arrive (it failed later, if at all, with the group's abort).
  std::string cause;
  if (group_ && std::string(failure.what()).find(" timed out after ") != std::string::npos) {
    const std::vector<int> missing = group_->missing_at_last_timeout();
    if (missing.size() == 1) {
      r = static_cast<size_t>(missing[0]);
      cause = "it did not arrive in time: ";
    }
  }
  const Device device = device_ids_[r];
  const bool oom = is_out_of_memory(failure.what());
  auto cannot = [&](const std::string& why) {
    throw ReplicaError(failure.replica(), failure.device(), detail::str_cat(failure.what(), " (on_device_failure could not "
                                                                  "recover: ", why, ")"), failure.later_failures());
  };
  const DeviceFailurePolicy policy = options_.on_device_failure;
  if (policy == DeviceFailurePolicy::RetrySmallerChunk && !oom) throw;
  if (spans_processes(options_.backend)) cannot("the group spans processes");
  if (accumulated) cannot("gradients accumulated before this step would be lost");
  NoGradGuard no_grad;
  for (auto& replica : replicas_) replica->zero_grad();
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
    if (device_ids_.size() == 1) cannot("it was the last device");
    if (options_.mode == ParallelMode::DP && r == 0) cannot(detail::str_cat("DP's master is on ", device));
    drop_device(r);
    done = detail::str_cat("dropped ", device, " (replica ", r, "): ", cause, failure.what(), "; the step was redone on ",
                           device_ids_.size(), " device(s) from ", device_ids_[0]);
  }
  // Undo the failed step's buffer updates (BatchNorm running statistics): every replica from replica 0's.
  for (auto& replica_buffers : replica_buffers_) {
    for (size_t b = 0; b < buffers.size(); ++b) replica_buffers[b].copy_(buffers[b]);
  }
  return done;
}

void DataParallel::drop_device(size_t r) {
  const Device dropped = device_ids_[r];
  // The old pool first: its threads are idle (the failed task returned its exception), so this joins them.
  pool_.reset();
  ddp_reducer_.reset();
  reducer_.reset();
  group_.reset();
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
  pool_ = std::make_unique<DeviceWorkerPool>(device_ids_, options_.deterministic ? 1 : 0);
  if (options_.mode == ParallelMode::DDP) connect_replicas();
  build_reducer();
}

}  // namespace dpe
