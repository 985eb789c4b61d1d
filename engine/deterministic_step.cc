#include "engine/deterministic_step.h"

#include <algorithm>
#include <functional>

#include "core/autograd/grad_mode.h"
#include "core/backends.h"
#include "core/error.h"
#include "core/lost_thread.h"
#include "core/ops.h"
#include "engine/shard_tree.h"
#include "engine/timing.h"

namespace dpe {

using detail::Clock;
using detail::ms_since;

namespace {

// v[lo][i] + ... + v[hi - 1][i] in the fixed tree, summed into v[lo][i] (per shard, the shards' own gradients
// or buffer copies, which nothing else holds).
Tensor tree_sum(std::vector<std::vector<Tensor>>& v, size_t i, size_t lo, size_t hi) {
  if (hi - lo == 1) return v[lo][i];
  const size_t mid = tree_split(lo, hi);
  Tensor left = tree_sum(v, i, lo, mid);
  return left.add_(tree_sum(v, i, mid, hi));
}

}  // namespace

struct DeterministicStep::Plan {
  Plan(int64_t dim, std::vector<int64_t> rows) : rows(dim, std::move(rows)) {}
  BatchShards rows;  // per virtual shard
  int64_t batch = 0;
  size_t shards = 0, used = 0;                     // virtual shards; devices that run some
  std::vector<size_t> first_shard;                 // device d runs shards [first_shard[d], first_shard[d + 1])
  std::vector<size_t> owner;                       // per shard: its device
  std::vector<std::vector<std::pair<size_t, size_t>>> owned;  // per device: its maximal tree nodes [lo, hi)
  std::vector<Tensor> start_buffers;               // the master's buffers before the step
  // Per shard: its gradient of each parameter (undefined: none reached it, or frozen), its buffers (on
  // device_ids[0]), its loss; per owned node (by its first shard): the sum of its shards' gradients.
  std::vector<std::vector<Tensor>> grads, buffers, node_sums;
  std::vector<double> losses;
  std::vector<double> forward_ms, backward_ms, reduce_ms;  // per device
};

DeterministicStep::DeterministicStep(StepContext& ctx, std::unique_ptr<Step> mode) : Step(ctx), mode_(std::move(mode)) {}

DeterministicStep::Plan DeterministicStep::plan_shards(const Tensor& input, const Tensor& target) {
  const size_t n = ctx_.replicas->size();
  int64_t dim = 0;
  const int64_t batch = step_batch(input, target, ctx_.options.dim, &dim);
  DPE_CHECK(batch > 0, "DataParallel::forward_backward: the batch is empty; expected at least one sample");
  const int64_t wanted = ctx_.options.virtual_shards > 0 ? ctx_.options.virtual_shards
                                                         : std::max<int64_t>(4, static_cast<int64_t>(n));
  Plan plan(dim, compute_chunk_sizes(batch, wanted, SplitRule::Balanced));
  plan.batch = batch;
  plan.shards = plan.rows.sizes.size();
  // Devices take contiguous runs of shards.
  const std::vector<int64_t> per_device =
      compute_chunk_sizes(static_cast<int64_t>(plan.shards), static_cast<int64_t>(n), SplitRule::Balanced);
  plan.used = per_device.size();
  plan.first_shard.assign(plan.used + 1, 0);
  plan.owner.resize(plan.shards);
  plan.owned.resize(plan.used);
  StepReport& report = ctx_.report;
  for (size_t d = 0; d < plan.used; ++d) {
    plan.first_shard[d + 1] = plan.first_shard[d] + static_cast<size_t>(per_device[d]);
    report.used_devices.push_back(ctx_.replicas->devices()[d]);
    report.chunk_sizes.push_back(0);
    for (size_t k = plan.first_shard[d]; k < plan.first_shard[d + 1]; ++k) {
      report.chunk_sizes.back() += plan.rows.sizes[k];
      plan.owner[k] = d;
    }
  }
  // Each maximal node of the tree whose shards all ran on one device is summed by that device (the same
  // additions, in the same order), and the rest of the tree joins those sums.
  std::function<void(size_t, size_t)> find_owned = [&](size_t lo, size_t hi) {
    if (plan.owner[lo] == plan.owner[hi - 1]) {
      plan.owned[plan.owner[lo]].emplace_back(lo, hi);
    } else {
      find_owned(lo, tree_split(lo, hi));
      find_owned(tree_split(lo, hi), hi);
    }
  };
  find_owned(0, plan.shards);
  plan.grads.resize(plan.shards);
  plan.buffers.resize(plan.shards);
  plan.node_sums.resize(plan.shards);
  plan.losses.assign(plan.shards, 0.0);
  plan.forward_ms.assign(plan.used, 0.0);
  plan.backward_ms.assign(plan.used, 0.0);
  plan.reduce_ms.assign(plan.used, 0.0);
  return plan;
}

// Each device runs its shards one by one, each alone from the step's starting buffers with gradients that
// start undefined; off CPU devices it then sums its maximal tree nodes.
void DeterministicStep::run_shards(Plan& plan, const Tensor& input, const Tensor& target, const LossFn& loss_fn) {
  ReplicaSet& replicas = *ctx_.replicas;
  const std::vector<bool>& trainable = replicas.trainable();
  const bool host_memory = std::all_of(replicas.devices().begin(), replicas.devices().end(),
                                       [](const Device& d) { return d.is_cpu(); });
  ctx_.report.device_compute_ms.assign(replicas.size(), 0.0);
  const auto step_start = Clock::now();
  replicas.run([&](size_t d) {
    if (d >= plan.used) return;
    const Device& device = replicas.devices()[d];
    for (size_t k = plan.first_shard[d]; k < plan.first_shard[d + 1]; ++k) {
      auto phase = Clock::now();
      {
        NoGradGuard no_grad;
        for (size_t b = 0; b < plan.start_buffers.size(); ++b) Tensor(replicas.buffers(d)[b]).copy_(plan.start_buffers[b]);
      }
      for (const Tensor& p : replicas.params(d)) p.set_grad({});
      Tensor x = plan.rows.of(input, k, device, /*non_blocking=*/false);
      Tensor y = plan.rows.of(target, k, device, /*non_blocking=*/false);
      Tensor loss = checked_loss(loss_fn, replicas.replica(d).forward(x), y);
      checkpoint_if_lost();  // before each write into `plan` (core/lost_thread.h)
      plan.forward_ms[d] += ms_since(phase);
      phase = Clock::now();
      ctx_.backward_root(loss * (static_cast<double>(plan.rows.sizes[k]) / static_cast<double>(plan.batch))).backward();
      checkpoint_if_lost();
      plan.backward_ms[d] += ms_since(phase);
      const double value = loss.item();  // a CUDA device waits for the shard here
      checkpoint_if_lost();
      plan.losses[k] = value;
      for (size_t p = 0; p < replicas.params(d).size(); ++p) {
        const Tensor& param = replicas.params(d)[p];
        plan.grads[k].push_back(!trainable[p] ? Tensor() : param.grad().defined() ? param.grad().contiguous() : zeros_like(param));
        param.set_grad({});
      }
      // Copied onto device_ids[0], where the buffers' tree is summed.
      for (const Tensor& b : replicas.buffers(d)) {
        plan.buffers[k].push_back(
            Tensor::empty(b.shape(), TensorOptions(b.dtype()).with_device(replicas.devices()[0])).copy_(b));
      }
    }
    ctx_.report.device_compute_ms[d] = ms_since(step_start);  // Note [What the auto split measures]
    if (host_memory) return;  // the root is summed from the shards' gradients (sum_on_host)
    const auto phase = Clock::now();
    NoGradGuard no_grad;
    for (const auto& [lo, hi] : plan.owned[d]) {
      for (size_t p = 0; p < trainable.size(); ++p) {
        plan.node_sums[lo].push_back(trainable[p] ? tree_sum(plan.grads, p, lo, hi) : Tensor());
      }
    }
    plan.reduce_ms[d] = ms_since(phase);
  });
}

// Note [The shards' sum in host memory]
// CPU devices read one another's memory, so the root needs no node sums and no copies: every device sums
// its slice (1/n) of each parameter straight from the K shards' gradients and writes it into every owner's
// .grad, a reduce-scatter and all-gather in one pass (tree_sum_buffers_cpu: the tree's additions, the bits
// of adding pairwise). Per device that reads K/n of the gradients and writes owners/n of them, where
// summing owned nodes and then joining them on every owner read and wrote each gradient about six times
// (the MLP's deterministic DDP step spent 0.6 ms there against DDP's 0.3 ms; docs/BENCHMARKS.md).
std::vector<std::vector<Tensor>> DeterministicStep::sum_on_host(const Plan& plan) {
  ReplicaSet& replicas = *ctx_.replicas;
  const std::vector<bool>& trainable = replicas.trainable();
  const size_t n = replicas.size(), owners = this->owners(), params = trainable.size();
  std::vector<std::vector<Tensor>> roots(owners, std::vector<Tensor>(params));
  for (size_t r = 0; r < owners; ++r) {
    for (size_t p = 0; p < params; ++p) {
      const Tensor& like = replicas.params(r)[p];
      if (trainable[p]) roots[r][p] = Tensor::empty(like.shape(), TensorOptions(like.dtype()).with_device(like.device()));
    }
  }
  replicas.run([&](size_t d) {
    for (size_t p = 0; p < params; ++p) {
      if (!trainable[p]) continue;
      const int64_t count = roots[0][p].numel();
      const int64_t begin = count * static_cast<int64_t>(d) / static_cast<int64_t>(n);
      const int64_t end = count * static_cast<int64_t>(d + 1) / static_cast<int64_t>(n);
      if (begin == end) continue;
      const size_t offset = static_cast<size_t>(begin) * element_size(roots[0][p].dtype());
      std::vector<const void*> in;
      for (size_t k = 0; k < plan.shards; ++k) in.push_back(static_cast<const char*>(plan.grads[k][p].data_ptr()) + offset);
      std::vector<void*> out;
      for (size_t r = 0; r < owners; ++r) out.push_back(static_cast<char*>(roots[r][p].data_ptr()) + offset);
      tree_sum_buffers_cpu(roots[0][p].dtype(), in, out, end - begin);
    }
  });
  return roots;
}

// The root from the owned nodes' sums, on device_ids[0]; each other owner's copy made on its worker.
std::vector<std::vector<Tensor>> DeterministicStep::sum_on_devices(const Plan& plan) {
  ReplicaSet& replicas = *ctx_.replicas;
  const std::vector<bool>& trainable = replicas.trainable();
  const size_t owners = this->owners(), params = trainable.size();
  const Device& first = replicas.devices()[0];
  std::vector<std::vector<Tensor>> roots(owners, std::vector<Tensor>(params));
  std::function<Tensor(size_t, size_t, size_t)> join = [&](size_t p, size_t lo, size_t hi) -> Tensor {
    if (plan.owner[lo] == plan.owner[hi - 1]) return plan.node_sums[lo][p].to(first);
    const size_t mid = tree_split(lo, hi);
    return add(join(p, lo, mid), join(p, mid, hi));
  };
  for (size_t p = 0; p < params; ++p) {
    if (trainable[p]) roots[0][p] = join(p, 0, plan.shards);
  }
  replicas.run([&](size_t r) {
    if (r == 0 || r >= owners) return;
    NoGradGuard no_grad;
    for (size_t p = 0; p < params; ++p) {
      if (trainable[p]) roots[r][p] = roots[0][p].to(replicas.devices()[r]);
    }
  });
  return roots;
}

// The shards' buffers (BatchNorm's running statistics after each shard's forward from the step's start)
// averaged in the same tree, into every replica (integer buffers take shard 0's).
void DeterministicStep::average_buffers(const Plan& plan) {
  std::vector<std::vector<Tensor>> buffers = plan.buffers;
  for (size_t b = 0; b < plan.start_buffers.size(); ++b) {
    Tensor value = buffers[0][b];
    if (is_floating_point(plan.start_buffers[b].dtype())) {
      value = tree_sum(buffers, b, 0, plan.shards) * (1.0 / static_cast<double>(plan.shards));
    }
    for (size_t r = 0; r < ctx_.replicas->size(); ++r) Tensor(ctx_.replicas->buffers(r)[b]).copy_(value);
  }
}

double DeterministicStep::forward_backward(const Tensor& input, const Tensor& target, const LossFn& loss_fn) {
  ReplicaSet& replicas = *ctx_.replicas;
  for (const Device& d : replicas.devices()) {
    DPE_CHECK(!d.is_cuda() || !backends::cudnn::benchmark(), "DataParallel: the deterministic mode on ", d, " needs "
              "cuDNN's deterministic algorithms; backends::cudnn::set_benchmark(true) (--cudnn-benchmark) chooses by "
              "speed: turn it off");
  }
  Plan plan = plan_shards(input, target);
  refresh_trainable();
  auto start = Clock::now();
  std::vector<size_t> to;  // the replicas compute with the master's values
  for (size_t d = 1; d < plan.used; ++d) to.push_back(d);
  ctx_.report.broadcast = replicate(to);
  ctx_.report.broadcast_ms = ms_since(start);
  // The step's starting buffers: the master's, cloned (replica 0 runs shards too and overwrites its own).
  for (const Tensor& b : replicas.buffers(0)) plan.start_buffers.push_back(b.detach().clone());
  run_shards(plan, input, target, loss_fn);
  ctx_.report.forward_ms = *std::max_element(plan.forward_ms.begin(), plan.forward_ms.end());
  ctx_.report.backward_ms = *std::max_element(plan.backward_ms.begin(), plan.backward_ms.end());

  start = Clock::now();
  NoGradGuard no_grad;
  const bool host_memory = std::all_of(replicas.devices().begin(), replicas.devices().end(),
                                       [](const Device& d) { return d.is_cpu(); });
  const std::vector<std::vector<Tensor>> roots = host_memory ? sum_on_host(plan) : sum_on_devices(plan);
  for (size_t r = 0; r < roots.size(); ++r) {
    for (size_t p = 0; p < roots[r].size(); ++p) {
      if (!roots[r][p].defined()) continue;
      const Tensor& param = replicas.params(r)[p];
      param.set_grad(param.grad().defined() ? param.grad() + roots[r][p] : roots[r][p]);
    }
  }
  average_buffers(plan);
  ctx_.report.reduce_ms = ms_since(start) + *std::max_element(plan.reduce_ms.begin(), plan.reduce_ms.end());
  double total = 0;
  for (size_t k = 0; k < plan.shards; ++k) total += plan.losses[k] * static_cast<double>(plan.rows.sizes[k]);
  return total / static_cast<double>(plan.batch);
}

}  // namespace dpe
