#include "engine/ddp_reducer.h"

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_set>

#include "core/allocator.h"
#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"
#include "core/copy.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/storage.h"
#include "engine/timing.h"

namespace dpe {

std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(const std::vector<Tensor>& params,
                                                                   const std::vector<size_t>& order,
                                                                   const std::vector<size_t>& limits,
                                                                   bool sort_by_min_index) {
  DPE_CHECK(!limits.empty(), "compute_bucket_assignment_by_size: no size limits");
  struct Open {
    std::vector<size_t> indices;
    size_t bytes = 0;
    size_t limit_index = 0;
  };
  std::vector<std::vector<size_t>> result;
  std::map<DType, Open> open;
  std::vector<DType> first_seen;
  for (size_t i : order) {
    DType dtype = params[i].dtype();
    if (!open.contains(dtype)) first_seen.push_back(dtype);
    Open& bucket = open[dtype];
    bucket.indices.push_back(i);
    bucket.bytes += params[i].nbytes();
    if (bucket.bytes >= limits[bucket.limit_index]) {
      result.push_back(std::move(bucket.indices));
      bucket.indices.clear();
      bucket.bytes = 0;
      bucket.limit_index = std::min(bucket.limit_index + 1, limits.size() - 1);
    }
  }
  for (DType dtype : first_seen) {
    if (!open[dtype].indices.empty()) result.push_back(std::move(open[dtype].indices));
  }
  if (sort_by_min_index) {
    std::sort(result.begin(), result.end(), [](const auto& a, const auto& b) {
      return *std::min_element(a.begin(), a.end()) < *std::min_element(b.begin(), b.end());
    });
  }
  return result;
}

struct DdpReducer::ReplicaState {
  std::vector<Tensor> buffers;     // per bucket: flat, on the replica's device
  std::vector<Tensor> views;       // per param: its slot in its bucket's buffer, param-shaped
  std::vector<int64_t> pending;    // per bucket: gradients still to come
  std::vector<bool> ready;         // per param, this iteration
  std::vector<int32_t> used;       // per param: had a gradient this iteration (find_unused)
  // per param, until its bucket is launched: what enters its slot, unweighted (the gradient the backward made,
  // read in place by all_reduce_into; or the slot itself: an attached gradient, zeros, a non-contiguous copy)
  std::vector<Tensor> pieces;
  size_t next_bucket = 0;
  double weight = 0;               // this replica's gradient's weight in the SUM (set_gradient_weight)
  int64_t launched_from_hooks = 0;
  double allreduce_ms = 0;
  std::vector<Tensor> shards;      // shard_gradients: per bucket, the reduced shard this replica owns
  std::vector<char> reduced;       // shard_gradients: per param, reduced since clear_shard_gradients
  std::optional<detail::Clock::time_point> entered_last_collective;
};

DdpReducer::DdpReducer(std::vector<std::vector<Tensor>> replica_params, std::vector<std::string> names,
                       std::shared_ptr<ProcessGroup> group, DdpReducerOptions options)
    : params_(std::move(replica_params)), names_(std::move(names)), group_(std::move(group)), options_(options) {
  DPE_INTERNAL_ASSERT(!params_.empty() && group_ && static_cast<size_t>(group_->size()) == params_.size());
  alone_ = group_->world_size() == 1 && !options_.reduce_dtype;  // Note [One replica in all]
  DPE_CHECK(options_.bucket_cap_bytes > 0 && options_.first_bucket_bytes > 0,
            "DDP: bucket sizes must be positive, got cap ", options_.bucket_cap_bytes, " B and first bucket ",
            options_.first_bucket_bytes, " B");
  const size_t n = params_[0].size();
  for (size_t r = 0; r < params_.size(); ++r) {
    DPE_INTERNAL_ASSERT(params_[r].size() == n, "replica ", r, " has a different parameter count");
    replicas_.push_back(std::make_unique<ReplicaState>());
    replicas_.back()->weight = 1.0 / static_cast<double>(group_->world_size());
  }
  std::vector<size_t> registration(n);
  for (size_t i = 0; i < n; ++i) registration[i] = i;
  std::vector<std::vector<size_t>> initial;
  if (options_.find_unused_parameters || options_.zero) {
    initial = compute_bucket_assignment_by_size(params_[0], registration,
                                                {options_.first_bucket_bytes, options_.bucket_cap_bytes}, true);
  } else {
    initial = compute_bucket_assignment_by_size(params_[0], registration, {SIZE_MAX}, true);
  }
  std::reverse(initial.begin(), initial.end());  // bucket 0 holds the last-registered parameters
  assign_buckets(std::move(initial));
  if (options_.zero) {
    std::vector<int64_t> numels;
    for (const Tensor& p : params_[0]) numels.push_back(p.numel());
    layout_ = std::make_unique<ZeroLayout>(buckets_, numels, static_cast<size_t>(group_->world_size()));
    for (auto& state : replicas_) {
      state->shards.assign(buckets_.size(), Tensor());
      state->reduced.assign(n, 0);
    }
  }
  hooks_ = std::make_unique<detail::ReplicaGradientHooks>(
      params_, [this](size_t r, size_t p) { on_gradient_ready(r, p); });
}

DdpReducer::~DdpReducer() = default;

void DdpReducer::assign_buckets(std::vector<std::vector<size_t>> buckets) {
  buckets_ = std::move(buckets);
  const size_t n = params_[0].size();
  bucket_of_.assign(n, 0);
  offset_of_.assign(n, 0);
  std::vector<int64_t> numel(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t p : buckets_[b]) {
      bucket_of_[p] = b;
      offset_of_[p] = numel[b];
      numel[b] += params_[0][p].numel();
    }
  }
  for (size_t r = 0; r < params_.size(); ++r) {
    ReplicaState& state = *replicas_[r];
    state.buffers.clear();
    state.views.assign(n, Tensor());
    // Note [One replica in all]: no bucket memory; ZeRO-2 stages a bucket only while it is sent.
    if (alone_ || options_.shard_gradients || buckets_.empty()) continue;
    MemoryKindGuard kind(MemoryKind::Gradients);  // the replica's .grad are views of its buckets
    // Note [One block per dtype for the buckets]
    // A replica's buckets of one dtype are consecutive slices of one flat buffer. The first iteration's single
    // bucket per dtype and the buckets rebuilt from the gradients' order then take the same number of bytes, so
    // the rebuild gets the block just freed back from the device's cache (core/allocator.h caches by exact
    // size) instead of fresh memory for every bucket: a whole gradient's worth of first touches (page faults
    // on CPU devices: about 3 s added to the Llama small preset's first step after the rebuild on 4 CPU
    // devices, docs/DATA_PARALLEL.md).
    std::map<DType, int64_t> dtype_numel;
    std::vector<int64_t> start(buckets_.size());
    for (size_t b = 0; b < buckets_.size(); ++b) {
      int64_t& total = dtype_numel[params_[r][buckets_[b][0]].dtype()];
      start[b] = total;
      total += numel[b];
    }
    std::map<DType, Tensor> flat;
    const Device device = params_[r][buckets_[0][0]].device();
    for (const auto& [dtype, total] : dtype_numel) {
      flat[dtype] = Tensor::empty({total}, TensorOptions(dtype).with_device(device));
    }
    for (size_t b = 0; b < buckets_.size(); ++b) {
      state.buffers.push_back(flat[params_[r][buckets_[b][0]].dtype()].narrow(0, start[b], numel[b]));
      for (size_t p : buckets_[b]) {
        state.views[p] = state.buffers[b].narrow(0, offset_of_[p], params_[r][p].numel()).view(params_[r][p].shape());
      }
    }
  }
}

void DdpReducer::prepare_for_backward() {
  if (rebuild_due_) {
    // Replica 0's observed ready order; parameters it never saw (none, without find_unused) go last.
    std::vector<size_t> order = ready_order_;
    std::vector<bool> seen(params_[0].size(), false);
    for (size_t p : order) seen[p] = true;
    for (size_t p = 0; p < seen.size(); ++p) {
      if (!seen[p]) order.push_back(p);
    }
    assign_buckets(compute_bucket_assignment_by_size(params_[0], order,
                                                     {options_.first_bucket_bytes, options_.bucket_cap_bytes}, false));
    rebuild_due_ = false;
    rebuilt_ = true;
  }
  for (auto& state : replicas_) {
    state->pending.clear();
    for (const auto& bucket : buckets_) state->pending.push_back(static_cast<int64_t>(bucket.size()));
    state->ready.assign(params_[0].size(), false);
    state->used.assign(params_[0].size(), 0);
    state->pieces.assign(params_[0].size(), Tensor());
    state->next_bucket = 0;
    state->launched_from_hooks = 0;
    state->allreduce_ms = 0;
    state->entered_last_collective.reset();
  }
  ready_order_.clear();
  armed_ = true;
}

namespace {

bool same_memory(const Tensor& a, const Tensor& b) { return a.defined() && a.data_ptr() == b.data_ptr(); }

}  // namespace

void DdpReducer::attach_gradients(size_t replica) {
  // Alone, the backward accumulates into .grad as it is (Note [One replica in all]).
  if (!armed_ || options_.find_unused_parameters || alone_ || options_.shard_gradients) return;
  NoGradGuard no_grad;
  ReplicaState& state = *replicas_[replica];
  for (size_t p = 0; p < params_[replica].size(); ++p) {
    const Tensor& param = params_[replica][p];
    const Tensor& view = state.views[p];
    // A gradient kept from earlier backwards (no_sync, zero_grad(false)) moves into its view, so this backward
    // accumulates there. An undefined one stays undefined: the backward's gradient is then stolen by the leaf
    // and scaled into the view in one pass (mark_ready), cheaper than zero-filling the view and adding to it.
    if (!param.grad().defined() || same_memory(param.grad(), view)) continue;
    copy_into(view, param.grad());
    param.set_grad(view);
  }
}

void DdpReducer::set_gradient_weight(size_t replica, double weight) {
  DPE_CHECK(weight >= 0 && weight <= 1, "DDP: replica ", replica, "'s gradient weight must be in [0, 1], got ", weight);
  replicas_[replica]->weight = weight;
}

void DdpReducer::on_gradient_ready(size_t replica, size_t param) {
  if (!armed_) return;  // no_sync, or a backward the engine does not manage: gradients accumulate locally
  mark_ready(replica, param, true);
}

// Note [Gradients enter their bucket in the all-reduce]
// PyTorch's reducer copies each gradient into its bucket (scaled) as it becomes ready, then all-reduces the
// bucket: one more pass over every gradient. Here all replicas live in one process, so on CPU devices the
// bucket's all-reduce (ProcessGroup::all_reduce_into) reads every replica's gradients where the backward left
// them and writes the weighted sum into every replica's bucket: the copy is gone (3% of a DDP MLP step's
// samples under perf, docs/BENCHMARKS.md). Other backends (CUDA, across processes) copy the scaled pieces
// into the bucket inside that call, which is what the hook did before. The cost: a fresh gradient stays alive
// until its bucket is launched (at most one bucket's worth past the hook) rather than being freed by the hook.
void DdpReducer::mark_ready(size_t replica, size_t param, bool from_hook) {
  ReplicaState& state = *replicas_[replica];
  DPE_CHECK(!state.ready[param], "DDP: parameter '", names_[param], "' of replica ", replica,
            " was marked ready twice in one backward; a parameter may take part in one backward pass per "
            "iteration (reentrant backward and shared parameters used in several backward calls are not supported)");
  state.ready[param] = true;
  const bool fixed = options_.find_unused_parameters || options_.zero;
  if (replica == 0 && !rebuilt_ && !fixed) ready_order_.push_back(param);
  NoGradGuard no_grad;
  const Tensor& grad = params_[replica][param].grad();
  const Tensor& view = state.views[param];
  if (alone_) {
    // Note [One replica in all]: the gradient stays where it is; there is no bucket to stage it in.
  } else if (options_.shard_gradients) {
    // Staged when its bucket is sent; undefined: zeros.
    if (from_hook && grad.defined()) {
      state.used[param] = 1;
      state.pieces[param] = grad.is_contiguous() ? grad : grad.contiguous();
    }
  } else if (from_hook && grad.defined()) {
    state.used[param] = 1;
    // Weighted when the bucket is all-reduced (all_reduce_into), so the SUM over every replica of every
    // process is the weighted average. A fresh gradient is not copied here: the all-reduce reads it in place
    // where the backend can (Note [Gradients enter their bucket in the all-reduce]).
    if (grad.is_contiguous()) {  // an attached gradient (the slot itself) or the backward's own tensor
      state.pieces[param] = grad;
    } else {
      copy_into(view, grad);
      state.pieces[param] = view;
    }
  } else {
    fill_into(view, 0.0);
    state.pieces[param] = view;
  }
  if (--state.pending[bucket_of_[param]] == 0) launch_ready_buckets(replica, from_hook);
}

// Note [One replica in all]
// DDP over a single device in a single process (`dpe bench --modes ddp` on one device, a run that lost every
// other device) has nothing to reduce: the weighted sum of one gradient with weight 1 is that gradient. The
// bucket step would copy every fresh gradient into its bucket (the backward made new tensors after
// zero_grad) and make .grad the bucket's view, a pass over every gradient and, on CUDA, a kernel per
// parameter inside backward, and the buckets would hold a second copy of the gradients. So a group of one
// member in all without reduce_dtype (whose rounding the user asked for) has no bucket memory: each gradient
// stays where the backward put it (accumulating there under no_sync), scaled in place only if its weight is
// not 1, and finalize_backward has nothing to write back. The buckets' bookkeeping (pending counts, launch
// order, the rebuild) still runs, so unused parameters are found and reported as with several devices.
void DdpReducer::launch_ready_buckets(size_t replica, bool from_hook) {
  ReplicaState& state = *replicas_[replica];
  while (state.next_bucket < buckets_.size() && state.pending[state.next_bucket] == 0) {
    const std::vector<size_t>& members = buckets_[state.next_bucket];
    NoGradGuard no_grad;
    if (alone_) {  // Note [One replica in all]: the weighted sum of one gradient; there is no bucket
      if (state.weight != 1.0) {
        for (size_t p : members) {
          if (params_[replica][p].grad().defined()) scale_into(params_[replica][p].grad(), state.weight);
        }
      }
      if (from_hook) ++state.launched_from_hooks;
      ++state.next_bucket;
      continue;
    }
    auto start = detail::Clock::now();
    state.entered_last_collective = start;
    std::vector<Tensor> pieces;
    for (size_t p : members) pieces.push_back(std::move(state.pieces[p]));
    if (options_.shard_gradients) {  // no bucket buffer: staged and reduce-scattered
      reduce_scatter_bucket(replica, state.next_bucket, pieces);
    } else {
      all_reduce_bucket(replica, state.next_bucket, pieces);
    }
    state.allreduce_ms += detail::ms_since(start);
    if (from_hook) ++state.launched_from_hooks;
    ++state.next_bucket;
  }
}

// The launch of bucket b into its buffer (every replica's weighted pieces summed there).
void DdpReducer::all_reduce_bucket(size_t replica, size_t bucket_index, const std::vector<Tensor>& pieces) {
  ReplicaState& state = *replicas_[replica];
  const std::vector<size_t>& members = buckets_[bucket_index];
  Tensor& bucket = state.buffers[bucket_index];
  if (options_.reduce_dtype && *options_.reduce_dtype != bucket.dtype()) {
    // Compressed on the wire (bf16_compress_hook): weighted into the bucket, rounded once, summed, and
    // widened back in place.
    for (size_t i = 0; i < members.size(); ++i) scaled_copy_into(state.views[members[i]], pieces[i], state.weight);
    Tensor wire = bucket.to(*options_.reduce_dtype);
    group_->all_reduce(static_cast<int>(replica), wire, ReduceOp::Sum);
    copy_into(bucket, wire);
  } else {
    group_->all_reduce_into(static_cast<int>(replica), bucket, pieces, state.weight);
  }
  // Gradients as bucket views (what finalize_backward expects of attached gradients); the backward's own
  // gradient tensors go with `pieces`.
  if (!options_.find_unused_parameters) {
    for (size_t p : members) {
      if (!same_memory(params_[replica][p].grad(), state.views[p])) params_[replica][p].set_grad(state.views[p]);
    }
  }
}

// ZeRO-2's launch of bucket b: the weighted pieces into a padded flat buffer (zeros where a parameter has
// none), reduce-scattered so that this replica receives the sum of the shard it owns; the bucket's gradients
// are then freed.
void DdpReducer::reduce_scatter_bucket(size_t replica, size_t bucket, const std::vector<Tensor>& pieces) {
  ReplicaState& state = *replicas_[replica];
  const std::vector<size_t>& members = buckets_[bucket];
  const Tensor& first = params_[replica][members[0]];
  const int64_t shard = layout_->shard_numel(bucket);
  const TensorOptions options = TensorOptions(first.dtype()).with_device(first.device());
  Tensor flat = Tensor::empty({layout_->padded_numel(bucket)}, options);
  int64_t end = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    const Tensor& param = params_[replica][members[i]];
    Tensor slot = flat.narrow(0, layout_->bucket_offset(members[i]), param.numel()).view(param.shape());
    end = layout_->bucket_offset(members[i]) + param.numel();
    if (pieces[i].defined()) {
      scaled_copy_into(slot, pieces[i], state.weight);
    } else {
      fill_into(slot, 0.0);
    }
  }
  if (end < flat.numel()) fill_into(flat.narrow(0, end, flat.numel() - end), 0.0);
  const DType wire = options_.reduce_dtype.value_or(first.dtype());
  Tensor input = wire == first.dtype() ? flat : flat.to(wire);
  Tensor output = Tensor::empty({shard}, TensorOptions(wire).with_device(first.device()));
  group_->reduce_scatter_tensor(static_cast<int>(replica), output, input, ReduceOp::Sum);
  if (wire != first.dtype()) output = output.to(first.dtype());
  Tensor& mine = state.shards[bucket];
  if (mine.defined()) {
    mine.add_(output);
  } else {
    mine = output;
    mine.storage()->set_memory_kind(MemoryKind::Gradients);  // the replica's gradient from now on
  }
  for (size_t p : members) params_[replica][p].set_grad(Tensor());
}

const Tensor& DdpReducer::shard_gradient(size_t replica, size_t bucket) const {
  DPE_INTERNAL_ASSERT(options_.shard_gradients && bucket < replicas_[replica]->shards.size());
  return replicas_[replica]->shards[bucket];
}

bool DdpReducer::reduced(size_t replica, size_t param) const { return replicas_[replica]->reduced[param] != 0; }

void DdpReducer::clear_shard_gradients(size_t replica) {
  ReplicaState& state = *replicas_[replica];
  for (Tensor& shard : state.shards) shard = Tensor();
  std::fill(state.reduced.begin(), state.reduced.end(), 0);
}

void DdpReducer::contribute_nothing(size_t replica) {
  if (!armed_) return;
  for (size_t p = 0; p < params_[replica].size(); ++p) {
    if (!replicas_[replica]->ready[p]) mark_ready(replica, p, false);
  }
}

void DdpReducer::mark_unused_parameters(size_t replica, const Tensor& loss) {
  if (!armed_ || !options_.find_unused_parameters) return;
  // Every leaf the loss's graph reaches, found by walking next_edges from its grad_fn.
  std::unordered_set<const TensorImpl*> reached;
  std::unordered_set<const autograd::Node*> visited;
  std::deque<const autograd::Node*> frontier;
  if (loss.grad_fn()) frontier.push_back(loss.grad_fn().get());
  while (!frontier.empty()) {
    const autograd::Node* node = frontier.front();
    frontier.pop_front();
    if (!visited.insert(node).second) continue;
    if (auto* acc = dynamic_cast<const autograd::AccumulateGrad*>(node)) reached.insert(acc->leaf());
    for (const autograd::Edge& e : node->next_edges) {
      if (e.node) frontier.push_back(e.node.get());
    }
  }
  for (size_t p = 0; p < params_[replica].size(); ++p) {
    if (!reached.contains(params_[replica][p].impl())) mark_ready(replica, p, false);
  }
}

void DdpReducer::finalize_backward(size_t replica) {
  ReplicaState& state = *replicas_[replica];
  if (state.next_bucket < buckets_.size()) {
    std::string missing;
    for (size_t p = 0; p < params_[replica].size(); ++p) {
      if (!state.ready[p]) missing += (missing.empty() ? "'" : ", '") + names_[p] + "'";
    }
    DPE_CHECK(false, "DDP: replica ", replica, " (", group_->devices()[replica], ") finished backward without "
              "reducing every bucket: parameters that received no gradient: ", missing,
              ". Expected every parameter to take part in producing the loss; if some legitimately do not, "
              "construct DataParallel with find_unused_parameters = true");
  }
  // Every bucket was launched: replica 0's ready order is complete for the rebuild.
  if (replica == 0 && !rebuilt_ && !options_.find_unused_parameters && !options_.zero) rebuild_due_ = true;
  if (alone_) return;  // Note [One replica in all]: every gradient is final where it is
  NoGradGuard no_grad;
  std::vector<int32_t> used(params_[replica].size(), 1);
  if (options_.find_unused_parameters) {
    Tensor map = Tensor::from_vector(state.used, {static_cast<int64_t>(state.used.size())},
                                     TensorOptions(DType::Int32).with_device(group_->devices()[replica]));
    state.entered_last_collective = detail::Clock::now();
    group_->all_reduce(static_cast<int>(replica), map, ReduceOp::Max);
    used = map.to_vector<int32_t>();
  }
  if (options_.shard_gradients) {  // the shards hold the reduced values; .grad was freed
    for (size_t p = 0; p < used.size(); ++p) state.reduced[p] = static_cast<char>(state.reduced[p] || used[p]);
    return;
  }
  for (size_t p = 0; p < params_[replica].size(); ++p) {
    if (!used[p]) continue;  // unused on every replica: .grad untouched, like PyTorch
    const Tensor& param = params_[replica][p];
    if (same_memory(param.grad(), state.views[p])) continue;  // attached: already the reduced values
    if (param.grad().defined()) {
      copy_into(param.grad(), state.views[p]);
    } else {
      param.set_grad(state.views[p].clone());
    }
  }
}

void DdpReducer::disarm() { armed_ = false; }

int64_t DdpReducer::launched_during_backward() const {
  int64_t total = 0;
  for (const auto& s : replicas_) total += s->launched_from_hooks;
  return total;
}

double DdpReducer::allreduce_ms(size_t replica) const { return replicas_[replica]->allreduce_ms; }

std::optional<detail::Clock::time_point> DdpReducer::entered_last_collective(size_t replica) const {
  return replicas_[replica]->entered_last_collective;
}

int64_t DdpReducer::allreduce_bytes() const {
  int64_t bytes = 0;
  if (options_.shard_gradients && !alone_) {  // each bucket's padded flat buffer goes into the reduce-scatter
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const Tensor& first = params_[0][buckets_[b][0]];
      bytes += layout_->padded_numel(b) *
               static_cast<int64_t>(element_size(options_.reduce_dtype.value_or(first.dtype())));
    }
    return bytes;
  }
  for (const Tensor& b : replicas_[0]->buffers) {
    bytes += b.numel() * static_cast<int64_t>(element_size(options_.reduce_dtype.value_or(b.dtype())));
  }
  return bytes;
}

}  // namespace dpe
