// DataParallel, the front: builds the replica set and the mode's step, and runs the step API through them
// with what every step shares (the report, the failure policy, Auto's measurement).
#include "engine/data_parallel.h"

#include <cmath>
#include <optional>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "engine/auto_mode.h"
#include "engine/ddp_step.h"
#include "engine/deterministic_step.h"
#include "engine/dp_step.h"
#include "engine/failure_policy.h"
#include "engine/step.h"
#include "engine/timing.h"
#include "engine/zero_optimizer.h"
#include "engine/zero_step.h"
#include "layers/sync_batchnorm.h"

namespace dpe {

NoSyncGuard::NoSyncGuard(DataParallel& dp) : dp_(dp), previous_(dp.ctx_->sync) { dp_.ctx_->sync = false; }

NoSyncGuard::~NoSyncGuard() { dp_.ctx_->sync = previous_; }

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, DataParallelOptions options)
    : ctx_(std::make_unique<StepContext>()) {
  DPE_CHECK(module != nullptr, "DataParallel: module is null");
  ctx_->options = std::move(options);
  init({std::move(module)});
}

DataParallel::DataParallel(std::vector<std::shared_ptr<nn::Module>> replicas, DataParallelOptions options)
    : ctx_(std::make_unique<StepContext>()) {
  DPE_CHECK(options.mode == ParallelMode::DDP, "DataParallel: a list of replicas is DDP mode's constructor; "
            "DP mode replicates one module");
  DPE_CHECK(!replicas.empty(), "DataParallel: the replica list is empty");
  for (size_t i = 0; i < replicas.size(); ++i) DPE_CHECK(replicas[i] != nullptr, "DataParallel: replica ", i, " is null");
  ctx_->options = std::move(options);
  init(std::move(replicas));
}

// given: the master alone (replicas cloned from it), or one replica per device (DDP).
void DataParallel::init(std::vector<std::shared_ptr<nn::Module>> given) {
  DataParallelOptions& options = ctx_->options;
  Placement placement = validate(options, given.size());
  ctx_->output_device = placement.output_device;
  if (options.mode == ParallelMode::Auto) {
    auto_mode_ = std::make_unique<AutoMode>();
    options.mode = ParallelMode::DP;  // measured first
  }
  ctx_->split = std::make_unique<BatchSplit>(options, placement.device_ids.size());
  // The deterministic mode's workers compute with one intra-op thread: results that do not depend on how many
  // devices share the cores.
  ctx_->replicas = std::make_unique<ReplicaSet>(std::move(given), std::move(placement.device_ids),
                                                options.deterministic ? 1 : 0, options.timeout);
  step_ = make_step(options.mode);
}

std::unique_ptr<Step> DataParallel::make_step(ParallelMode mode) {
  std::unique_ptr<Step> step;
  if (mode == ParallelMode::DDP && ctx_->options.zero_stage > 0) {
    step = std::make_unique<ZeroStep>(*ctx_);
  } else if (mode == ParallelMode::DDP) {
    step = std::make_unique<DdpStep>(*ctx_);
  } else {
    step = std::make_unique<DpStep>(*ctx_);
  }
  if (ctx_->options.deterministic) step = std::make_unique<DeterministicStep>(*ctx_, std::move(step));
  return step;
}

DataParallel::~DataParallel() {
  step_.reset();
  // A worker lost in an earlier step may still be inside its optimizer (Note [Lost workers]).
  for (auto& optimizer : ctx_->optimizers) ctx_->replicas->retire(std::shared_ptr<optim::Optimizer>(std::move(optimizer)));
}

Tensor DataParallel::forward(const Tensor& input) {
  DPE_CHECK(input.defined(), "DataParallel::forward: undefined input");
  std::vector<Tensor> outputs = forward_args(nn::ModuleInput(input));
  DPE_CHECK(outputs.size() == 1, "DataParallel::forward: the module returned ", outputs.size(),
            " outputs; use forward_args for several");
  return outputs[0];
}

std::vector<Tensor> DataParallel::forward_args(const nn::ModuleInput& input) {
  ctx_->replicas->check_master_placement();
  ctx_->report = StepReport{.mode = mode()};
  return step_->forward(input);
}

double DataParallel::forward_backward(const Tensor& input, const Tensor& target, const LossFn& loss) {
  DPE_CHECK(input.defined() && target.defined(), "DataParallel::forward_backward: undefined input or target");
  DPE_CHECK(input.dim() > 0, "DataParallel::forward_backward: the input is 0-dim; expected a batch along dim ",
            ctx_->options.dim);
  DPE_CHECK(static_cast<bool>(loss), "DataParallel::forward_backward: no loss function");
  if (ctx_->options.on_device_failure == DeviceFailurePolicy::Fail) return forward_backward_once(input, target, loss);
  return run_surviving_failures(*ctx_, *step_, [&] { return forward_backward_once(input, target, loss); });
}

double DataParallel::forward_backward_once(const Tensor& input, const Tensor& target, const LossFn& loss) {
  StepReport& report = ctx_->report;
  report = StepReport{.mode = mode()};
  report.loss = step_->forward_backward(input, target, loss);
  report.loss_scale = ctx_->scaler ? ctx_->scaler->get_scale() : 1.0;
  if (ctx_->split->observe(report)) step_->split_changed();
  record_memory(*ctx_);
  return report.loss;
}

void DataParallel::set_optimizer(const OptimizerFactory& make) {
  DPE_CHECK(static_cast<bool>(make), "DataParallel::set_optimizer: no factory");
  ctx_->make_optimizer = make;
  // A worker lost in an earlier step may still be inside its optimizer (Note [Lost workers]).
  for (auto& optimizer : ctx_->optimizers) ctx_->replicas->retire(std::shared_ptr<optim::Optimizer>(std::move(optimizer)));
  ctx_->optimizers.clear();
  for (size_t r = 0; r < step_->owners(); ++r) {
    ctx_->optimizers.push_back(make(ctx_->replicas->replica(r).parameters()));
    DPE_CHECK(ctx_->optimizers.back() != nullptr, "DataParallel::set_optimizer: the factory returned null");
  }
  step_->optimizers_made();
}

optim::Optimizer& DataParallel::optimizer(size_t replica) {
  DPE_CHECK(!ctx_->optimizers.empty(), "DataParallel: no optimizer; call set_optimizer first");
  DPE_CHECK(replica < ctx_->optimizers.size(), "DataParallel: optimizer ", replica, " does not exist; this ",
            mode_name(mode()), "-mode engine has ", ctx_->optimizers.size());
  return *ctx_->optimizers[replica];
}

void DataParallel::optimizer_step() { step_->optimizer_step(); }

void DataParallel::consolidate_state_dict() {
  DPE_CHECK(!ctx_->optimizers.empty(), "DataParallel::consolidate_state_dict: no optimizer; call set_optimizer first");
  step_->consolidate_state_dict();
}

void DataParallel::zero_grad() { step_->zero_grad(); }

double DataParallel::clip_grad_norm(double max_norm) {
  DPE_CHECK(std::isfinite(max_norm) && max_norm >= 0, "DataParallel::clip_grad_norm: max_norm ", max_norm,
            "; expected a finite number >= 0");
  return step_->clip_grad_norm(max_norm);
}

double DataParallel::train_step(const Tensor& input, const Tensor& target, const LossFn& loss_fn) {
  DPE_CHECK(ctx_->sync, "DataParallel::train_step inside no_sync(): the optimizer would step on gradients that were "
            "not reduced; call forward_backward there and train_step (or optimizer_step) after");
  const auto start = detail::Clock::now();
  zero_grad();
  const double loss = forward_backward(input, target, loss_fn);
  optimizer_step();
  if (auto_mode_) {
    if (const std::optional<ParallelMode> next = auto_mode_->record(mode(), detail::ms_since(start))) set_mode(*next);
    ctx_->report.auto_mode = auto_mode_->report();
  }
  return loss;
}

void DataParallel::set_mode(ParallelMode mode) {
  DPE_CHECK(mode != ParallelMode::Auto, "DataParallel::set_mode(auto): Auto is chosen at construction "
            "(DataParallelOptions::mode); expected dp or ddp");
  DPE_CHECK(ctx_->sync, "DataParallel::set_mode inside no_sync(): the accumulated gradients would be dropped; switch "
            "between steps");
  DPE_CHECK(!spans_processes(ctx_->options.backend), "DataParallel::set_mode: switching modes across processes "
            "(backend '", backend_name(ctx_->options.backend), "') is not supported; construct a new DataParallel");
  if (mode == this->mode()) return;
  NoGradGuard no_grad;
  ReplicaSet& replicas = *ctx_->replicas;
  std::vector<std::unique_ptr<optim::Optimizer>>& optimizers = ctx_->optimizers;
  // The whole state, taken while every replica's part is there (a ZeRO optimizer gathers it).
  std::optional<optim::OptimizerStateDict> state;
  if (!optimizers.empty()) state = optimizers[0]->state_dict();
  for (size_t r = 0; r < replicas.size(); ++r) replicas.replica(r).zero_grad();
  // The old step's reducer and group go (or are kept for a lost worker) before the new step's are built; DDP's
  // construction gives every replica the master's parameters and buffers.
  const ParallelMode before = this->mode();
  step_.reset();
  ctx_->options.mode = mode;
  try {
    step_ = make_step(mode);
  } catch (...) {
    ctx_->options.mode = before;  // the engine stays usable in the mode it had
    step_ = make_step(before);
    throw;
  }
  if (!state) return;
  // Replica 0's optimizer is the master's in both modes (unless ZeRO sharded it); DDP gives every other replica
  // one with its state.
  const size_t kept = dynamic_cast<ZeroOptimizer*>(optimizers[0].get()) ? 0 : 1;
  for (size_t r = kept; r < optimizers.size(); ++r) replicas.retire(std::shared_ptr<optim::Optimizer>(std::move(optimizers[r])));
  optimizers.resize(kept);
  for (size_t r = kept; r < step_->owners(); ++r) {
    optimizers.push_back(ctx_->make_optimizer(replicas.replica(r).parameters()));
    optimizers.back()->load_state_dict(*state);
  }
  step_->optimizers_made();
}

void DataParallel::set_grad_scaler(std::shared_ptr<optim::GradScaler> scaler) { ctx_->scaler = std::move(scaler); }
optim::GradScaler* DataParallel::grad_scaler() const { return ctx_->scaler.get(); }
bool DataParallel::require_backward_grad_sync() const { return ctx_->sync; }
ParallelMode DataParallel::mode() const { return ctx_->options.mode; }
std::vector<int64_t> DataParallel::chunk_sizes(int64_t batch) const { return ctx_->split->chunk_sizes(batch); }
nn::Module& DataParallel::replica(size_t i) { return ctx_->replicas->replica(i); }
std::shared_ptr<nn::Module> DataParallel::module_ptr() { return ctx_->replicas->replica_ptr(0); }
std::vector<Tensor> DataParallel::parameters() const { return ctx_->replicas->replica_ptr(0)->parameters(); }
size_t DataParallel::num_optimizers() const { return ctx_->optimizers.size(); }
ProcessGroup* DataParallel::process_group() { return step_->process_group(); }
const DdpReducer* DataParallel::ddp_reducer() const { return step_->ddp_reducer(); }
const std::vector<Device>& DataParallel::device_ids() const { return ctx_->replicas->devices(); }
const Device& DataParallel::output_device() const { return ctx_->output_device; }
const DataParallelOptions& DataParallel::options() const { return ctx_->options; }
const StepReport& DataParallel::last_step() const { return ctx_->report; }
int64_t DataParallel::replicas_created() const { return ctx_->replicas->replicas_created(); }
int64_t DataParallel::threads_created() const { return ctx_->replicas->threads_created(); }
size_t DataParallel::num_buckets() const { return step_->num_buckets(); }

}  // namespace dpe
