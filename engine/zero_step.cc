#include "engine/zero_step.h"

#include <cmath>
#include <optional>

#include "core/autograd/grad_mode.h"
#include "core/copy.h"
#include "core/error.h"
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
      grad = full.contiguous().view({-1}).narrow(0, piece.start, piece.length);
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
    Tensor all = Tensor::empty({shard * static_cast<int64_t>(layout.ranks())}, options);
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
  if (took_step) replicas.run([&](size_t r) { all_gather_parameters(r); }, group);
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

std::vector<StepReport::MemoryUse> ZeroStep::memory_use() const {
  std::vector<StepReport::MemoryUse> out = Step::memory_use();
  if (ctx_.options.zero_stage != 2) return out;
  const DdpReducer& reducer = *ddp_->ddp_reducer();
  for (size_t r = 0; r < out.size(); ++r) {
    for (size_t b = 0; b < reducer.num_buckets(); ++b) {
      if (const Tensor& shard = reducer.shard_gradient(r, b); shard.defined()) {
        out[r].gradients += static_cast<int64_t>(shard.nbytes());
      }
    }
  }
  return out;
}

void ZeroStep::optimizers_made() {
  repartition([] {});
}

template <typename Change>
void ZeroStep::repartition(const Change& change) {
  std::optional<optim::OptimizerStateDict> state;
  if (!ctx_.optimizers.empty()) state = ctx_.optimizers[0]->state_dict();  // the whole, from every replica
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
                                                params_[r], layout.pieces(rank(r)), peers);
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
