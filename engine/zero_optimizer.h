// ZeroOptimizer: one replica's part of a ZeRO-sharded optimizer (PyTorch's ZeroRedundancyOptimizer; the
// partition is engine/zero_layout.h's flat one). Its param groups hold this replica's pieces (1-D views of the
// parameters' owned elements) with the user's hyper-parameters, so schedulers, GradScaler::unscale_ and the
// engine's clipping act on what this replica steps; step() runs the factory's own optimizer on the pieces, so
// the update is the same arithmetic as plain DDP's, element for element.
//
// Its state_dict() is the whole optimizer's, as plain DDP would save it (every parameter's state gathered from
// the replicas that own its pieces, on this replica's device), and load_state_dict / check_state_dict take that
// whole form, checked against the whole optimizer's structure, and keep only this replica's pieces. So a
// checkpoint does not depend on the stage, the mode or the device count it was written with. Across processes
// the pieces of other processes are out of reach: state_dict() returns what the engine gathered last
// (set_consolidated: DataParallel::consolidate_state_dict, ZeroRedundancyOptimizer's consolidate_state_dict)
// until the next step, and refuses without it.
//
// Thread-safety: step() on this replica's worker; state_dict() reads every peer's shard, so no peer may step
// meanwhile (the engine calls it between steps).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "engine/zero_layout.h"
#include "optim/optimizer.h"

namespace dpe {

class ZeroOptimizer;
// Every replica's ZeroOptimizer, by rank (each one's state_dict gathers from all).
struct ZeroPeers {
  std::vector<const ZeroOptimizer*> ranks;
};

class ZeroOptimizer final : public optim::Optimizer {
 public:
  // whole and shard: two optimizers from the user's factory over this replica's parameters(); `whole` is never
  // stepped and keeps the structure (groups, shapes, the hyper-parameters' rules); `shard`'s groups become the
  // pieces. params: the reducer's parameters of this replica (the layout's indices); pieces: this replica's
  // (ZeroLayout::pieces(rank)); ranks: the layout's (peers hold them all in one process).
  ZeroOptimizer(std::unique_ptr<optim::Optimizer> whole, std::unique_ptr<optim::Optimizer> shard,
                const std::vector<Tensor>& params, const std::vector<ZeroPiece>& pieces,
                std::shared_ptr<ZeroPeers> peers, size_t ranks);

  void step() override;
  optim::OptimizerStateDict state_dict() const override;
  void load_state_dict(const optim::OptimizerStateDict& state) override;
  void check_state_dict(const optim::OptimizerStateDict& state) const override;
  std::string hyper_parameter_violation(const std::string& name, double value) const override;
  std::string state_scalar_violation(const std::string& name, double value) const override;
  std::string param_group_violation(double lr, const std::map<std::string, double>& options) const override;
  std::vector<std::string> state_tensor_names() const override { return whole_->state_tensor_names(); }
  std::vector<std::string> state_scalar_names() const override { return whole_->state_scalar_names(); }

  // The piece tensors, in the order of the `pieces` given (the engine sets their .grad).
  const std::vector<Tensor>& pieces() const { return pieces_; }

  // For the engine's gathering across processes (ZeroStep): the whole optimizer's structure and
  // hyper-parameters without state; this replica's shard state and piece k's index in it; reducer parameter
  // p's packed index in the whole optimizer (-1: not in it); the gathered whole state.
  optim::OptimizerStateDict whole_structure() const;
  optim::OptimizerStateDict shard_state_dict() const { return shard_->state_dict(); }
  int64_t shard_index(size_t piece) const { return piece_shard_index_[piece]; }
  int64_t whole_index(size_t param) const { return whole_index_[param]; }
  void set_consolidated(optim::OptimizerStateDict state) { consolidated_ = std::move(state); }
  int64_t state_bytes() const override { return shard_->state_bytes(); }

 private:
  // Where a parameter of the whole optimizer (packed index) lies in this replica's shard.
  struct Slot {
    int64_t shard_index;  // packed index in `shard`
    int64_t start, length;
  };
  std::unique_ptr<optim::Optimizer> whole_;
  std::unique_ptr<optim::Optimizer> shard_;
  std::vector<Tensor> pieces_;
  std::vector<std::optional<Slot>> slots_;  // per packed index of `whole`
  std::vector<int64_t> piece_shard_index_, whole_index_;
  std::shared_ptr<ZeroPeers> peers_;
  size_t ranks_;
  std::optional<optim::OptimizerStateDict> consolidated_;  // across processes, until the next step
};

}  // namespace dpe
