#include "engine/zero_step.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "core/autograd/grad_mode.h"
#include "core/copy.h"
#include "core/error.h"
#include "core/ops.h"
#include "engine/ddp_reducer.h"
#include "engine/zero_optimizer.h"
#include "optim/clip_grad.h"

namespace dpe {

ZeroStep::ZeroStep(StepContext& ctx)
    : Step(ctx), ddp_(std::make_unique<DdpStep>(ctx)), params_(ctx.replicas->trainable_params()) {}

ZeroStep::~ZeroStep() = default;

size_t ZeroStep::rank(size_t r) const {
  return static_cast<size_t>(ddp_->process_group()->global_rank(static_cast<int>(r)));
}

ZeroOptimizer& ZeroStep::optimizer(size_t r) {
  auto* zero = dynamic_cast<ZeroOptimizer*>(ctx_.optimizers.at(r).get());
  DPE_INTERNAL_ASSERT(zero != nullptr, "ZeRO: optimizer ", r, " is not sharded");
  return *zero;
}

double ZeroStep::forward_backward(const Tensor& input, const Tensor& target, const LossFn& loss) {
  refresh_trainable();  // ours, so that a change re-partitions before DDP's reducer runs
  const double value = ddp_->forward_backward(input, target, loss);
  if (!ctx_.optimizers.empty()) {
    for (size_t r = 0; r < ctx_.replicas->size(); ++r) attach_gradients(r);
  }
  return value;
}

// Each owned piece's .grad: its slice of the reduced shard (stage 2, after a synchronised backward) or of the
// parameter's .grad (stage 1; stage 2 inside no_sync or alone); undefined where the parameter has none, so
// that the optimizer skips it as DDP's would.
void ZeroStep::attach_gradients(size_t r) {
  const DdpReducer& reducer = *ddp_->ddp_reducer();
  const std::vector<ZeroPiece>& pieces = reducer.zero_layout().pieces(rank(r));
  const std::vector<Tensor>& tensors = optimizer(r).pieces();
  DPE_INTERNAL_ASSERT(pieces.size() == tensors.size());
  NoGradGuard no_grad;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const ZeroPiece& piece = pieces[k];
    Tensor grad;
    if (ctx_.options.zero_stage == 2 && reducer.shard_gradient(r, piece.bucket).defined()) {
      if (reducer.reduced(r, piece.param)) {
        grad = reducer.shard_gradient(r, piece.bucket).narrow(0, piece.shard_offset, piece.length);
      }
    } else if (const Tensor& full = params_[r][piece.param].grad(); full.defined()) {
      // A leaf's .grad is contiguous (AccumulateGrad, the buckets), so the piece is a view: what unscale_ and
      // clipping do to it lands in the gradient itself, and attaching again finds it there.
      DPE_INTERNAL_ASSERT(full.is_contiguous(), "ZeRO: a non-contiguous .grad");
      grad = full.view({-1}).narrow(0, piece.start, piece.length);
    }
    tensors[k].set_grad(grad);
  }
}

// Every bucket's parameters from their owners: this replica's shard (its pieces, padded) all-gathered into the
// whole bucket, copied into the parameters.
void ZeroStep::all_gather_parameters(size_t r) {
  const DdpReducer& reducer = *ddp_->ddp_reducer();
  const ZeroLayout& layout = reducer.zero_layout();
  if (layout.ranks() == 1) return;
  NoGradGuard no_grad;
  const std::vector<ZeroPiece>& pieces = layout.pieces(rank(r));
  const std::vector<Tensor>& tensors = optimizer(r).pieces();
  size_t k = 0;
  for (size_t b = 0; b < reducer.num_buckets(); ++b) {
    const std::vector<size_t>& members = reducer.buckets()[b];
    const Tensor& first = params_[r][members[0]];
    const TensorOptions options = TensorOptions(first.dtype()).with_device(first.device());
    const int64_t shard = layout.shard_numel(b);
    Tensor mine = Tensor::empty({shard}, options);
    int64_t filled = 0;
    for (; k < pieces.size() && pieces[k].bucket == b; ++k) {
      copy_into(mine.narrow(0, pieces[k].shard_offset, pieces[k].length), tensors[k]);
      filled = pieces[k].shard_offset + pieces[k].length;
    }
    if (filled < shard) fill_into(mine.narrow(0, filled, shard - filled), 0.0);
    Tensor all = Tensor::empty({layout.padded_numel(b)}, options);
    ddp_->process_group()->all_gather_into_tensor(static_cast<int>(r), all, mine);
    for (size_t p : members) {
      const Tensor& param = params_[r][p];
      copy_into(param, all.narrow(0, layout.bucket_offset(p), param.numel()).view(param.shape()));
    }
  }
}

bool ZeroStep::step_optimizers(optim::GradScaler* scaler) {
  ReplicaSet& replicas = *ctx_.replicas;
  ProcessGroup* group = ddp_->process_group();
  replicas.run([&](size_t r) { attach_gradients(r); }, group);
  // Every replica its pieces; all or none skip. Through Step, whose friend this is.
  const bool took_step = static_cast<Step&>(*ddp_).step_optimizers(scaler);
  if (took_step) {
    replicas.run([&](size_t r) { all_gather_parameters(r); }, group);
    // The parameters sent back to every replica: reported with the broadcasts (DP's parameters travel there too).
    const ZeroLayout& layout = ddp_->ddp_reducer()->zero_layout();
    if (layout.ranks() > 1) {
      for (size_t b = 0; b < layout.num_buckets(); ++b) {
        const Tensor& first = params_[0][ddp_->ddp_reducer()->buckets()[b][0]];
        ctx_.report.broadcast.bytes += layout.padded_numel(b) *
                                       static_cast<int64_t>(element_size(first.dtype())) *
                                       static_cast<int64_t>(replicas.size());
      }
    }
  }
  return took_step;
}

void ZeroStep::zero_grad() {
  Step::zero_grad();
  DdpReducer& reducer = ddp_->reducer();
  for (size_t r = 0; r < ctx_.replicas->size(); ++r) {
    reducer.clear_shard_gradients(r);
    if (ctx_.optimizers.empty()) continue;
    for (const Tensor& piece : optimizer(r).pieces()) piece.set_grad(Tensor());
  }
}

// The norm over every replica's pieces (each element of the model's gradient is in exactly one): each
// replica's sum of squares, all-reduced.
double ZeroStep::clip_grad_norm(double max_norm) {
  DPE_CHECK(!ctx_.optimizers.empty(), "DataParallel::clip_grad_norm: no optimizer; call set_optimizer first");
  ReplicaSet& replicas = *ctx_.replicas;
  ProcessGroup* group = ddp_->process_group();
  std::vector<double> norms(replicas.size(), 0.0);
  replicas.run([&](size_t r) {
    attach_gradients(r);
    const std::vector<Tensor>& pieces = optimizer(r).pieces();
    Tensor power = Tensor::from_vector(std::vector<double>{optim::grad_norm_power(pieces)}, {1},
                                       TensorOptions(DType::Float64).with_device(replicas.devices()[r]));
    group->all_reduce(static_cast<int>(r), power, ReduceOp::Sum);
    const double norm = std::sqrt(power.item());
    optim::clip_grads_with_norm_(pieces, max_norm, norm);
    norms[r] = norm;
  }, group);
  return norms[0];
}

void ZeroStep::optimizers_made() {
  ddp_->optimizers_made();  // across processes: the factory's optimizers checked before they are sharded
  repartition([] {});
}

bool ZeroStep::across_processes() const {
  ProcessGroup& group = *ddp_->process_group();
  return group.world_size() > group.size();
}

void ZeroStep::consolidate_state_dict() {
  if (!across_processes()) return;  // state_dict() gathers from the replicas of this process
  const optim::OptimizerStateDict state = gather_state_across_processes();
  for (size_t r = 0; r < ctx_.optimizers.size(); ++r) optimizer(r).set_consolidated(state);
}

// Each bucket's state, one tensor name at a time: every replica writes its pieces' state into a zeroed
// bucket-sized buffer at their places, and a sum over every replica of every process fills it (each element
// has one owner, so the sum is exact); scalars (Adam's step, the same for every piece of a parameter) by a
// maximum over a per-parameter vector, -inf where a replica has no state for it.
optim::OptimizerStateDict ZeroStep::gather_state_across_processes() {
  ReplicaSet& replicas = *ctx_.replicas;
  const DdpReducer& reducer = *ddp_->ddp_reducer();
  const ZeroLayout& layout = reducer.zero_layout();
  ProcessGroup& group = *ddp_->process_group();
  optim::OptimizerStateDict out = optimizer(0).whole_structure();
  const std::vector<std::string> names = optimizer(0).state_tensor_names();
  const std::vector<std::string> scalar_names = optimizer(0).state_scalar_names();
  const size_t count = params_[0].size();
  replicas.run([&](size_t r) {
    NoGradGuard no_grad;
    ZeroOptimizer& mine = optimizer(r);
    const optim::OptimizerStateDict shard = mine.shard_state_dict();
    const std::vector<ZeroPiece>& pieces = layout.pieces(rank(r));
    const Device& device = replicas.devices()[r];
    const auto has_state = [&](size_t k) { return shard.tensors.count(mine.shard_index(k)) > 0; };
    // Which parameters have state anywhere, and their scalars.
    std::vector<double> values((1 + scalar_names.size()) * count, -std::numeric_limits<double>::infinity());
    for (size_t k = 0; k < pieces.size(); ++k) {
      if (!has_state(k)) continue;
      const size_t p = pieces[k].param;
      values[p] = 1;
      for (size_t s = 0; s < scalar_names.size(); ++s) {
        values[(1 + s) * count + p] = shard.scalars.at(mine.shard_index(k)).at(scalar_names[s]);
      }
    }
    Tensor found = Tensor::from_vector(values, {static_cast<int64_t>(values.size())},
                                       TensorOptions(DType::Float64).with_device(device));
    group.all_reduce(static_cast<int>(r), found, ReduceOp::Max);
    values = found.to_vector<double>();
    size_t k = 0;
    for (size_t b = 0; b < reducer.num_buckets(); ++b) {
      const std::vector<size_t>& members = reducer.buckets()[b];
      const size_t first_piece = k;
      while (k < pieces.size() && pieces[k].bucket == b) ++k;
      if (std::none_of(members.begin(), members.end(), [&](size_t p) { return values[p] > 0; })) continue;
      const int64_t shard_numel = layout.shard_numel(b);
      const int64_t base = static_cast<int64_t>(rank(r)) * shard_numel;
      for (const std::string& name : names) {
        Tensor bucket = zeros({layout.padded_numel(b)},
                              TensorOptions(params_[r][members[0]].dtype()).with_device(device));
        for (size_t j = first_piece; j < k; ++j) {
          if (!has_state(j)) continue;
          copy_into(bucket.narrow(0, base + pieces[j].shard_offset, pieces[j].length),
                    shard.tensors.at(mine.shard_index(j)).at(name));
        }
        group.all_reduce(static_cast<int>(r), bucket, ReduceOp::Sum);
        if (r != 0) continue;
        for (size_t p : members) {
          if (values[p] <= 0) continue;
          const Tensor& param = params_[0][p];
          out.tensors[mine.whole_index(p)][name] =
              bucket.narrow(0, layout.bucket_offset(p), param.numel()).view(param.shape()).clone();
        }
      }
    }
    if (r != 0) return;
    for (size_t p = 0; p < count; ++p) {
      if (values[p] <= 0) continue;
      for (size_t s = 0; s < scalar_names.size(); ++s) {
        out.scalars[mine.whole_index(p)][scalar_names[s]] = values[(1 + s) * count + p];
      }
    }
  }, &group);
  return out;
}

template <typename Change>
void ZeroStep::repartition(const Change& change) {
  std::optional<optim::OptimizerStateDict> state;
  if (!ctx_.optimizers.empty()) {
    // The whole state: from every replica of this process, or, sharded across processes, gathered from all.
    const bool sharded = dynamic_cast<ZeroOptimizer*>(ctx_.optimizers[0].get()) != nullptr;
    state = sharded && across_processes() ? gather_state_across_processes() : ctx_.optimizers[0]->state_dict();
  }
  change();
  params_ = ctx_.replicas->trainable_params();
  if (!state) return;
  ReplicaSet& replicas = *ctx_.replicas;
  // A worker lost in an earlier step may still be inside its optimizer (Note [Lost workers]).
  for (auto& old : ctx_.optimizers) replicas.retire(std::shared_ptr<optim::Optimizer>(std::move(old)));
  ctx_.optimizers.clear();
  const ZeroLayout& layout = ddp_->ddp_reducer()->zero_layout();
  auto peers = std::make_shared<ZeroPeers>();
  for (size_t r = 0; r < replicas.size(); ++r) {
    const std::vector<Tensor> parameters = replicas.replica(r).parameters();
    auto zero = std::make_unique<ZeroOptimizer>(ctx_.make_optimizer(parameters), ctx_.make_optimizer(parameters),
                                                params_[r], layout.pieces(rank(r)), peers, layout.ranks());
    peers->ranks.push_back(zero.get());
    ctx_.optimizers.push_back(std::move(zero));
  }
  for (auto& zero : ctx_.optimizers) zero->load_state_dict(*state);
}

void ZeroStep::trainable_changed() {
  repartition([&] { ddp_->trainable_changed(); });
}

void ZeroStep::replica_dropped(size_t r) {
  repartition([&] { ddp_->replica_dropped(r); });
}

}  // namespace dpe
