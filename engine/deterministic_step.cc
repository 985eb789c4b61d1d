// The deterministic step (DataParallelOptions::deterministic): the same bits whatever the device count and
// whichever mode, because nothing a device computes depends on which device it is or how many there are.
//
//  1. The batch is cut into K virtual shards by the balanced rule (K = virtual_shards), the same cut for any
//     device count; the devices take contiguous runs of shards (balanced over the devices).
//  2. Each shard runs alone on its device's replica, whose parameters are the master's (DP: copied from it;
//     DDP: kept identical) and whose buffers are reset to the step's starting buffers S: forward, the loss
//     (the shard's mean) times n_k / N, backward into gradients that start undefined, so that each shard's
//     gradient is its own, computed by the same kernels on the same shapes with one intra-op thread (the
//     pool's workers run with one in this mode) wherever it runs.
//  3. The shards' gradients are summed in a fixed binary tree by shard index (engine/shard_tree.h): on CPU
//     devices each device sums a slice of every parameter straight from the shards' gradients (Note [The
//     shards' sum in host memory]); elsewhere each device sums the tree's nodes whose shards it ran and the
//     rest of the tree joins those on device_ids[0]. Their buffers (BatchNorm's running statistics after the
//     shard's forward from S) are averaged in the same tree: statistics are per virtual shard, and the step's
//     update is the mean of the shards' (integer buffers take shard 0's).
//  4. DP: the master's .grad gets the sum (accumulating onto a defined one) and its buffers the mean; DDP:
//     every replica's. The optimizers then do the same arithmetic in either mode. Inside no_sync too: the
//     sum is per backward, so accumulated steps end with the same gradients a synchronised backward would
//     give, and no replica's .grad is ever only its own.
// CUDA devices: the same, as far as the kernels are deterministic (docs/DATA_PARALLEL.md lists them): cuDNN's
// convolutions run deterministic algorithms (conv_cuda.cu; a step refuses CUDA devices while
// backends::cudnn::benchmark is on: it may choose others, per device), cuBLAS repeats its bits on one stream
// per device, dpe's reductions use fixed trees; index_add (Embedding's backward) uses atomics and is not.
#include <algorithm>
#include <functional>

#include "core/autograd/grad_mode.h"
#include "core/backends.h"
#include "core/error.h"
#include "core/lost_thread.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "engine/shard_tree.h"
#include "engine/timing.h"
#include "engine/worker_pool.h"

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

void DataParallel::check_deterministic_options() const {
  if (!options_.deterministic) {
    DPE_CHECK(options_.virtual_shards == 0, "DataParallel: virtual_shards = ", options_.virtual_shards,
              " is the deterministic mode's; set deterministic = true or leave it 0");
    return;
  }
  DPE_CHECK(options_.virtual_shards >= 0, "DataParallel: virtual_shards must be >= 0 (0: the default), got ",
            options_.virtual_shards);
  DPE_CHECK(!spans_processes(options_.backend), "DataParallel: the deterministic mode runs in one process; backend '",
            backend_name(options_.backend), "' spans processes");
  DPE_CHECK(options_.split != SplitRule::Auto && options_.split != SplitRule::Weighted, "DataParallel: the "
            "deterministic mode cuts batches into its own virtual shards; split ", split_rule_name(options_.split),
            " does not apply (use chunk)");
}

double DataParallel::forward_backward_deterministic(const Tensor& input, const Tensor& target, const LossFn& loss_fn) {
  const size_t n = device_ids_.size();
  int64_t dim = 0;
  const int64_t batch = step_batch(input, target, &dim);
  DPE_CHECK(batch > 0, "DataParallel::forward_backward: the batch is empty; expected at least one sample");
  if (backends::cudnn::benchmark()) {
    for (const Device& d : device_ids_) {
      DPE_CHECK(!d.is_cuda(), "DataParallel: the deterministic mode on ", d, " needs cuDNN's deterministic "
                "algorithms; backends::cudnn::set_benchmark(true) (--cudnn-benchmark) chooses by speed: turn it off");
    }
  }
  report_ = StepReport{.mode = options_.mode};
  const int64_t k_wanted = options_.virtual_shards > 0 ? options_.virtual_shards : std::max<int64_t>(4, static_cast<int64_t>(n));
  const std::vector<int64_t> shard_rows = compute_chunk_sizes(batch, k_wanted, SplitRule::Balanced);
  const size_t shards = shard_rows.size();
  std::vector<int64_t> shard_offset(shards, 0);
  for (size_t k = 1; k < shards; ++k) shard_offset[k] = shard_offset[k - 1] + shard_rows[k - 1];
  // Devices take contiguous runs of shards.
  const std::vector<int64_t> per_device = compute_chunk_sizes(static_cast<int64_t>(shards), static_cast<int64_t>(n),
                                                              SplitRule::Balanced);
  const size_t used = per_device.size();
  std::vector<size_t> first_shard(used + 1, 0);
  for (size_t d = 0; d < used; ++d) first_shard[d + 1] = first_shard[d] + static_cast<size_t>(per_device[d]);
  report_.used_devices.assign(device_ids_.begin(), device_ids_.begin() + static_cast<int64_t>(used));
  for (size_t d = 0; d < used; ++d) {
    report_.chunk_sizes.push_back(0);
    for (size_t k = first_shard[d]; k < first_shard[d + 1]; ++k) report_.chunk_sizes.back() += shard_rows[k];
  }

  refresh_trainable();
  auto start = Clock::now();
  if (options_.mode == ParallelMode::DP) sync_replicas(used);  // the replicas compute with the master's values
  report_.broadcast_ms = ms_since(start);
  // The step's starting buffers: the master's, cloned (replica 0 runs shards too and overwrites its own).
  std::vector<Tensor> start_buffers;
  for (const Tensor& b : replica_buffers_[0]) start_buffers.push_back(b.detach().clone());

  // CPU devices sum the tree from the shards' gradients in host memory (Note [The shards' sum in host memory]).
  // Elsewhere, the fixed tree over the shards: each maximal node whose shards all ran on one device is summed
  // by that device (the same additions, in the same order), and the rest of the tree joins those sums.
  const bool host_memory = std::all_of(device_ids_.begin(), device_ids_.end(), [](const Device& d) { return d.is_cpu(); });
  std::vector<size_t> owner(shards);
  for (size_t d = 0; d < used; ++d) {
    for (size_t k = first_shard[d]; k < first_shard[d + 1]; ++k) owner[k] = d;
  }
  std::vector<std::vector<std::pair<size_t, size_t>>> owned(used);  // per device: its maximal nodes [lo, hi)
  std::function<void(size_t, size_t)> find_owned = [&](size_t lo, size_t hi) {
    if (owner[lo] == owner[hi - 1]) {
      owned[owner[lo]].emplace_back(lo, hi);
      return;
    }
    const size_t mid = tree_split(lo, hi);
    find_owned(lo, mid);
    find_owned(mid, hi);
  };
  find_owned(0, shards);

  // Per shard: its gradient of each parameter (undefined: none reached it, or frozen), its buffers, its loss;
  // per owned node (by its first shard): the sum of its shards' gradients.
  std::vector<std::vector<Tensor>> grads(shards), buffers(shards), node_sums(shards);
  std::vector<double> losses(shards, 0.0);
  std::vector<double> forward_ms(used, 0), backward_ms(used, 0), reduce_ms(used, 0);
  report_.device_compute_ms.assign(n, 0.0);
  const auto step_start = Clock::now();
  run_replicas([&](size_t d) {
    if (d >= used) return;
    nn::Module& replica = *replicas_[d];
    for (size_t k = first_shard[d]; k < first_shard[d + 1]; ++k) {
      auto phase = Clock::now();
      {
        NoGradGuard no_grad;
        for (size_t b = 0; b < start_buffers.size(); ++b) replica_buffers_[d][b].copy_(start_buffers[b]);
      }
      for (const Tensor& p : replica_params_[d]) p.set_grad({});
      Tensor x = input.narrow(dim, shard_offset[k], shard_rows[k]).to(device_ids_[d]).contiguous();
      Tensor y = target.narrow(dim, shard_offset[k], shard_rows[k]).to(device_ids_[d]).contiguous();
      Tensor loss = checked_loss(loss_fn, replica.forward(x), y);
      checkpoint_if_lost();  // before each write into this frame (core/lost_thread.h)
      forward_ms[d] += ms_since(phase);
      phase = Clock::now();
      backward_root(loss * (static_cast<double>(shard_rows[k]) / static_cast<double>(batch))).backward();
      checkpoint_if_lost();
      backward_ms[d] += ms_since(phase);
      const double value = loss.item();  // a CUDA device waits for the shard here
      checkpoint_if_lost();
      losses[k] = value;
      for (size_t p = 0; p < replica_params_[d].size(); ++p) {
        const Tensor& param = replica_params_[d][p];
        grads[k].push_back(!trainable_[p] ? Tensor() : param.grad().defined() ? param.grad().contiguous() : zeros_like(param));
        param.set_grad({});
      }
      // Copied onto device_ids[0], where the buffers' tree is summed.
      for (const Tensor& b : replica_buffers_[d]) {
        buffers[k].push_back(Tensor::empty(b.shape(), TensorOptions(b.dtype()).with_device(device_ids_[0])).copy_(b));
      }
    }
    report_.device_compute_ms[d] = ms_since(step_start);  // Note [What the auto split measures]
    if (host_memory) return;  // the root is summed from the shards' gradients below
    const auto phase = Clock::now();
    NoGradGuard no_grad;
    for (const auto& [lo, hi] : owned[d]) {
      for (size_t p = 0; p < replica_params_[d].size(); ++p) node_sums[lo].push_back(trainable_[p] ? tree_sum(grads, p, lo, hi) : Tensor());
    }
    reduce_ms[d] = ms_since(phase);
  });
  report_.forward_ms = *std::max_element(forward_ms.begin(), forward_ms.end());
  report_.backward_ms = *std::max_element(backward_ms.begin(), backward_ms.end());

  start = Clock::now();
  NoGradGuard no_grad;
  // Per owner of a .grad (DP: the master; DDP: every replica), the tree's root of each trainable parameter.
  const size_t owners = options_.mode == ParallelMode::DDP ? n : 1;
  const size_t params = replica_params_[0].size();
  std::vector<std::vector<Tensor>> roots(owners, std::vector<Tensor>(params));
  if (host_memory) {
    // Note [The shards' sum in host memory]
    // CPU devices read one another's memory, so the root needs no node sums and no copies: every device sums
    // its slice (1/n) of each parameter straight from the K shards' gradients and writes it into every owner's
    // .grad, a reduce-scatter and all-gather in one pass (tree_sum_buffers_cpu: the tree's additions, the bits
    // of adding pairwise). Per device that reads K/n of the gradients and writes owners/n of them, where
    // summing owned nodes and then joining them on every owner read and wrote each gradient about six times
    // (the MLP's deterministic DDP step spent 0.6 ms there against DDP's 0.3 ms; docs/BENCHMARKS.md).
    for (size_t r = 0; r < owners; ++r) {
      for (size_t p = 0; p < params; ++p) {
        const Tensor& like = replica_params_[r][p];
        if (trainable_[p]) roots[r][p] = Tensor::empty(like.shape(), TensorOptions(like.dtype()).with_device(device_ids_[r]));
      }
    }
    run_replicas([&](size_t d) {
      for (size_t p = 0; p < params; ++p) {
        if (!trainable_[p]) continue;
        const int64_t count = roots[0][p].numel();
        const int64_t begin = count * static_cast<int64_t>(d) / static_cast<int64_t>(n);
        const int64_t end = count * static_cast<int64_t>(d + 1) / static_cast<int64_t>(n);
        if (begin == end) continue;
        const size_t offset = static_cast<size_t>(begin) * element_size(roots[0][p].dtype());
        std::vector<const void*> in;
        for (size_t k = 0; k < shards; ++k) in.push_back(static_cast<const char*>(grads[k][p].data_ptr()) + offset);
        std::vector<void*> out;
        for (size_t r = 0; r < owners; ++r) out.push_back(static_cast<char*>(roots[r][p].data_ptr()) + offset);
        tree_sum_buffers_cpu(roots[0][p].dtype(), in, out, end - begin);
      }
    });
  } else {
    // The root from the owned nodes' sums, on device_ids[0]; each other owner's copy made on its worker.
    std::function<Tensor(size_t, size_t, size_t)> join = [&](size_t p, size_t lo, size_t hi) -> Tensor {
      if (owner[lo] == owner[hi - 1]) return node_sums[lo][p].to(device_ids_[0]);
      const size_t mid = tree_split(lo, hi);
      return add(join(p, lo, mid), join(p, mid, hi));
    };
    for (size_t p = 0; p < params; ++p) {
      if (trainable_[p]) roots[0][p] = join(p, 0, shards);
    }
    run_replicas([&](size_t r) {
      if (r == 0 || r >= owners) return;
      NoGradGuard no_grad;
      for (size_t p = 0; p < params; ++p) {
        if (trainable_[p]) roots[r][p] = roots[0][p].to(device_ids_[r]);
      }
    });
  }
  for (size_t r = 0; r < owners; ++r) {
    for (size_t p = 0; p < params; ++p) {
      if (!trainable_[p]) continue;
      const Tensor& param = replica_params_[r][p];
      param.set_grad(param.grad().defined() ? param.grad() + roots[r][p] : roots[r][p]);
    }
  }
  for (size_t b = 0; b < start_buffers.size(); ++b) {
    Tensor value;
    if (is_floating_point(start_buffers[b].dtype())) {
      value = tree_sum(buffers, b, 0, shards) * (1.0 / static_cast<double>(shards));
    } else {
      value = buffers[0][b];
    }
    for (size_t r = 0; r < n; ++r) replica_buffers_[r][b].copy_(value);  // every replica: the master's
  }
  report_.reduce_ms = ms_since(start) + *std::max_element(reduce_ms.begin(), reduce_ms.end());
  double total = 0;
  for (size_t k = 0; k < shards; ++k) total += losses[k] * static_cast<double>(shard_rows[k]);
  return total / static_cast<double>(batch);
}

}  // namespace dpe
