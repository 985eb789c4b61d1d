#include "engine/failure_policy.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "engine/replica_error.h"

namespace dpe {

namespace {

// What one recovery needs to know and may throw.
struct Recovery {
  StepContext& ctx;
  Step& step;
  const ReplicaError& failure;

  // The policy gives up: the failure, rethrown with the reason.
  [[noreturn]] void cannot(const std::string& why) const {
    throw ReplicaError(failure.replica(), failure.device(),
                       detail::str_cat(failure.message(), " (on_device_failure could not recover: ", why, ")"),
                       failure.later_failures(), failure.kind());
  }
};

// RetrySmallerChunk: replica r keeps its place with half its share; the split becomes weighted by the shares
// the failed step had.
std::string retry_smaller_chunk(const Recovery& recovery, size_t r) {
  StepContext& ctx = recovery.ctx;
  const Device& device = ctx.replicas->devices()[r];
  if (ctx.options.deterministic) recovery.cannot("the deterministic mode's virtual shards do not shrink");
  std::vector<int64_t> shares = ctx.report.chunk_sizes;
  shares.resize(ctx.replicas->size(), 0);
  if (shares[r] <= 1) recovery.cannot(detail::str_cat(device, " ran out of memory with ", shares[r], " sample(s)"));
  std::vector<double> weights(shares.begin(), shares.end());
  weights[r] = static_cast<double>(shares[r] / 2);
  ctx.options.split = SplitRule::Weighted;
  ctx.options.split_weights = std::move(weights);
  ctx.split->rule_changed();
  return detail::str_cat(device, " (replica ", r, ") ran out of memory with ", shares[r], " samples; the step was "
                         "redone with ", shares[r] / 2, " there");
}

void drop_replica(StepContext& ctx, Step& step, size_t r) {
  const Device dropped = ctx.replicas->devices()[r];
  ctx.replicas->drop(r);
  ctx.options.device_ids = ctx.replicas->devices();
  if (ctx.options.split == SplitRule::Weighted) {
    ctx.options.split_weights.erase(ctx.options.split_weights.begin() + static_cast<std::ptrdiff_t>(r));
  }
  ctx.split->drop();
  if (ctx.output_device == dropped) ctx.output_device = ctx.replicas->devices()[0];
  step.replica_dropped(r);
}

// DropDevice: the failed replica and every lost one go; the step is redone on the others.
std::string drop_devices(const Recovery& recovery, std::vector<size_t> dropped, const std::string& cause) {
  StepContext& ctx = recovery.ctx;
  std::sort(dropped.begin(), dropped.end());
  if (dropped.size() >= ctx.replicas->size()) recovery.cannot("it was the last device");
  // A step with one owner (DP) keeps the gradients and the optimizer on replica 0, the master.
  if (recovery.step.owners() == 1 && dropped[0] == 0) {
    recovery.cannot(detail::str_cat("DP's master is on ", ctx.replicas->devices()[0]));
  }
  std::string names;
  for (size_t d : dropped) {
    names += detail::str_cat(names.empty() ? "" : ", ", ctx.replicas->devices()[d], " (replica ", d, ")");
  }
  for (auto it = dropped.rbegin(); it != dropped.rend(); ++it) drop_replica(ctx, recovery.step, *it);
  return detail::str_cat("dropped ", names, ": ", cause, recovery.failure.what(), "; the step was redone on ",
                         ctx.replicas->size(), " device(s) from ", ctx.replicas->devices()[0]);
}

// Recovers from `failure` if the policy allows (returns what it did) or rethrows it. `buffers`: replica 0's
// buffers from before the step; `accumulated`: whether the step started with gradients (a redo would lose
// them). Called inside the handler of the failed attempt.
std::string recover(const Recovery& recovery, const std::vector<Tensor>& buffers, bool accumulated) {
  StepContext& ctx = recovery.ctx;
  const ReplicaError& failure = recovery.failure;
  size_t r = static_cast<size_t>(failure.replica());
  // A collective timeout (DDP's all-reduce, DP's reduction in shares) is reported by a partner that waited
  // (first, or after a partner its abort woke); the device to drop is the one that did not arrive (it failed
  // later, if at all, with the abort).
  std::string cause;
  const std::vector<ReplicaError::Failure>& later = failure.later_failures();
  if (failure.kind() == ErrorKind::Timeout || std::any_of(later.begin(), later.end(), [](const auto& f) {
        return f.kind == ErrorKind::Timeout;
      })) {
    const std::vector<int> missing = recovery.step.missing_at_last_timeout();
    if (missing.size() == 1) {
      r = static_cast<size_t>(missing[0]);
      cause = "it did not arrive in time: ";
    }
  }
  const DeviceFailurePolicy policy = ctx.options.on_device_failure;
  // Lost workers (stuck past the straggler timeout) are dropped whatever failed first.
  const std::vector<size_t> lost = ctx.replicas->lost_workers();
  if (!lost.empty() && policy == DeviceFailurePolicy::RetrySmallerChunk) {
    recovery.cannot("a device is lost (stuck), and retry_smaller_chunk only handles out-of-memory errors");
  }
  if (policy == DeviceFailurePolicy::RetrySmallerChunk && failure.kind() != ErrorKind::OutOfMemory) throw;
  if (spans_processes(ctx.options.backend)) recovery.cannot("the group spans processes");
  if (accumulated) recovery.cannot("gradients accumulated before this step would be lost");
  NoGradGuard no_grad;
  // Not a lost replica's gradients: its thread may still be writing them (Note [Lost workers]); it is dropped.
  for (size_t i = 0; i < ctx.replicas->size(); ++i) {
    if (std::find(lost.begin(), lost.end(), i) == lost.end()) ctx.replicas->replica(i).zero_grad();
  }
  std::string done;
  if (policy == DeviceFailurePolicy::RetrySmallerChunk) {
    done = retry_smaller_chunk(recovery, r);
  } else {
    std::vector<size_t> dropped = lost;
    if (std::find(dropped.begin(), dropped.end(), r) == dropped.end()) dropped.push_back(r);
    done = drop_devices(recovery, std::move(dropped), cause);
  }
  // Undo the failed step's buffer updates (BatchNorm running statistics): every replica from replica 0's.
  for (size_t i = 0; i < ctx.replicas->size(); ++i) {
    for (size_t b = 0; b < buffers.size(); ++b) Tensor(ctx.replicas->buffers(i)[b]).copy_(buffers[b]);
  }
  return done;
}

}  // namespace

double run_surviving_failures(StepContext& ctx, Step& step, const std::function<double()>& attempt) {
  std::vector<std::string> recovered;
  bool accumulated = false;
  for (const Tensor& p : ctx.replicas->params(0)) accumulated = accumulated || p.grad().defined();
  while (true) {
    std::vector<Tensor> buffers;
    for (const Tensor& b : ctx.replicas->buffers(0)) buffers.push_back(b.detach().clone());
    try {
      const double loss = attempt();
      ctx.report.recovered_failures = std::move(recovered);
      return loss;
    } catch (const ReplicaError& failure) {
      recovered.push_back(recover(Recovery{ctx, step, failure}, buffers, accumulated));  // or rethrows
    }
  }
}

}  // namespace dpe
