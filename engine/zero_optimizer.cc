#include "engine/zero_optimizer.h"

#include <algorithm>
#include <map>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"

namespace dpe {

namespace {

std::map<std::string, double> defaults_of(const optim::Optimizer& optimizer) {
  const auto& groups = optimizer.param_groups();
  return groups.empty() ? std::map<std::string, double>{} : groups[0].options;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(std::unique_ptr<optim::Optimizer> whole, std::unique_ptr<optim::Optimizer> shard,
                             const std::vector<Tensor>& params, const std::vector<ZeroPiece>& pieces,
                             std::shared_ptr<ZeroPeers> peers, size_t ranks)
    : Optimizer(whole->type_name(), defaults_of(*whole), 0.0),
      whole_(std::move(whole)),
      shard_(std::move(shard)),
      piece_shard_index_(pieces.size(), -1),
      whole_index_(params.size(), -1),
      peers_(std::move(peers)),
      ranks_(ranks) {
  DPE_INTERNAL_ASSERT(whole_->type_name() == shard_->type_name() &&
                      whole_->param_groups().size() == shard_->param_groups().size());
  NoGradGuard no_grad;
  // This replica's piece of each reducer parameter (at most one: engine/zero_layout.h).
  std::map<const TensorImpl*, size_t> piece_of, param_of;
  for (size_t p = 0; p < params.size(); ++p) param_of[params[p].impl()] = p;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const ZeroPiece& piece = pieces[k];
    pieces_.push_back(params[piece.param].detach().view({-1}).narrow(0, piece.start, piece.length));
    piece_of[params[piece.param].impl()] = k;
  }
  int64_t shard_index = 0;
  for (size_t g = 0; g < whole_->param_groups().size(); ++g) {
    const optim::ParamGroup& group = whole_->param_groups()[g];
    std::vector<Tensor> mine;
    for (const Tensor& p : group.params) {
      if (auto param = param_of.find(p.impl()); param != param_of.end()) {
        whole_index_[param->second] = static_cast<int64_t>(slots_.size());
      }
      auto it = piece_of.find(p.impl());
      if (it == piece_of.end()) {
        slots_.emplace_back(std::nullopt);
        continue;
      }
      const ZeroPiece& piece = pieces[it->second];
      piece_shard_index_[it->second] = shard_index;
      slots_.emplace_back(Slot{shard_index++, piece.start, piece.length});
      mine.push_back(pieces_[it->second]);
    }
    shard_->param_groups()[g].params = mine;
    add_param_group(optim::ParamGroup{.params = std::move(mine), .lr = group.lr, .options = group.options});
  }
}

optim::OptimizerStateDict ZeroOptimizer::whole_structure() const {
  optim::OptimizerStateDict out = whole_->state_dict();  // `whole` never holds state
  for (size_t g = 0; g < out.param_groups.size(); ++g) {
    out.param_groups[g].lr = param_groups()[g].lr;
    out.param_groups[g].options = param_groups()[g].options;
  }
  return out;
}

void ZeroOptimizer::step() {
  consolidated_.reset();
  // The user's hyper-parameters (a scheduler changes this optimizer's groups) are the shard's.
  for (size_t g = 0; g < param_groups().size(); ++g) {
    shard_->param_groups()[g].lr = param_groups()[g].lr;
    shard_->param_groups()[g].options = param_groups()[g].options;
  }
  shard_->step();
}

optim::OptimizerStateDict ZeroOptimizer::state_dict() const {
  if (peers_->ranks.size() < ranks_) {
    DPE_CHECK(consolidated_.has_value(), "ZeRO across processes: the optimizer state is spread over ", ranks_,
              " devices of several processes; call DataParallel::consolidate_state_dict() on every process first "
              "(PyTorch's ZeroRedundancyOptimizer.consolidate_state_dict)");
    return *consolidated_;
  }
  optim::OptimizerStateDict out = whole_structure();
  std::vector<optim::OptimizerStateDict> shards;
  for (const ZeroOptimizer* peer : peers_->ranks) shards.push_back(peer->shard_->state_dict());
  std::vector<const Tensor*> packed;
  for (const optim::ParamGroup& group : whole_->param_groups()) {
    for (const Tensor& p : group.params) packed.push_back(&p);
  }
  NoGradGuard no_grad;
  for (size_t i = 0; i < slots_.size(); ++i) {
    // The pieces of parameter i, by their first element; a parameter has state where its pieces have.
    std::vector<std::pair<const Slot*, size_t>> parts;
    for (size_t k = 0; k < peers_->ranks.size(); ++k) {
      const std::optional<Slot>& slot = peers_->ranks[k]->slots_[i];
      if (slot && shards[k].scalars.count(slot->shard_index) + shards[k].tensors.count(slot->shard_index)) {
        parts.emplace_back(&*slot, k);
      }
    }
    if (parts.empty()) continue;
    std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first->start < b.first->start; });
    const Tensor& param = *packed[i];
    int64_t covered = 0;
    for (const auto& [slot, k] : parts) covered += slot->length;
    DPE_INTERNAL_ASSERT(covered == param.numel(), "ZeRO: parameter ", i, " has state for ", covered, " of ",
                        param.numel(), " elements");
    for (const std::string& name : state_tensor_names()) {
      std::vector<Tensor> pieces;
      for (const auto& [slot, k] : parts) pieces.push_back(shards[k].tensors.at(slot->shard_index).at(name).to(param.device()));
      out.tensors[static_cast<int64_t>(i)][name] = cat(pieces, 0).view(param.shape());
    }
    const auto& [slot, k] = parts[0];
    if (shards[k].scalars.count(slot->shard_index)) {
      out.scalars[static_cast<int64_t>(i)] = shards[k].scalars.at(slot->shard_index);
    }
  }
  return out;
}

void ZeroOptimizer::check_state_dict(const optim::OptimizerStateDict& state) const { whole_->check_state_dict(state); }

void ZeroOptimizer::load_state_dict(const optim::OptimizerStateDict& state) {
  check_state_dict(state);
  consolidated_.reset();
  optim::OptimizerStateDict mine;
  mine.type = state.type;
  int64_t next = 0;
  for (size_t g = 0; g < state.param_groups.size(); ++g) {
    optim::OptimizerStateDict::Group group{.lr = state.param_groups[g].lr, .options = state.param_groups[g].options};
    for (size_t j = 0; j < shard_->param_groups()[g].params.size(); ++j) group.params.push_back(next++);
    mine.param_groups.push_back(std::move(group));
  }
  NoGradGuard no_grad;
  for (const auto& [i, named] : state.tensors) {
    const std::optional<Slot>& slot = slots_[static_cast<size_t>(i)];
    if (!slot) continue;
    for (const auto& [name, t] : named) {
      mine.tensors[slot->shard_index][name] = t.reshape({-1}).narrow(0, slot->start, slot->length);
    }
  }
  for (const auto& [i, named] : state.scalars) {
    if (const std::optional<Slot>& slot = slots_[static_cast<size_t>(i)]) mine.scalars[slot->shard_index] = named;
  }
  shard_->load_state_dict(mine);
  for (size_t g = 0; g < state.param_groups.size(); ++g) {
    param_groups()[g].lr = state.param_groups[g].lr;
    param_groups()[g].options = state.param_groups[g].options;
  }
}

std::string ZeroOptimizer::hyper_parameter_violation(const std::string& name, double value) const {
  return whole_->hyper_parameter_violation(name, value);
}

std::string ZeroOptimizer::state_scalar_violation(const std::string& name, double value) const {
  return whole_->state_scalar_violation(name, value);
}

std::string ZeroOptimizer::param_group_violation(double lr, const std::map<std::string, double>& options) const {
  return whole_->param_group_violation(lr, options);
}

}  // namespace dpe
