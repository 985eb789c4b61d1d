#include "tools/dpe/training.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/autograd/grad_mode.h"
#include "core/backends.h"
#include "core/ops.h"
#include "data/fashion_mnist.h"
#include "data/text_corpus.h"
#include "io/checkpoint.h"
#include "layers/containers.h"
#include "layers/sync_batchnorm.h"
#include "models/models.h"
#include "optim/grad_scaler.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "scatter_gather/chunking.h"

namespace dpe::tool {

ModelData load_model_data(const std::string& model, const std::string& data_dir, int64_t limit, bool with_test) {
  ModelData data;
  if (model == "tiny-llama") {
    // At least 2 records: a training and a test part.
    data::TextCorpus corpus = data::load_text_corpus({data_dir.empty() ? data::kFortunesPath : data_dir},
                                                     models::kTinyLlamaSeqLen, {.min_records = 2});
    int64_t n = corpus.size(), test = std::max<int64_t>(1, n / 10), train = n - test;
    if (limit >= 0) train = std::min(train, limit);
    DPE_CHECK(train > 0, "the training set is empty (--limit ", limit, "); expected at least one sample");
    data.train_inputs = corpus.inputs.narrow(0, 0, train);
    data.train_targets = corpus.targets.narrow(0, 0, train);
    data.test_inputs = corpus.inputs.narrow(0, n - test, test);
    data.test_targets = corpus.targets.narrow(0, n - test, test);
    return data;
  }
  models::check_model_name(model);
  std::string dir = data_dir.empty() ? data::kFashionMnistDir : data_dir;
  data::Dataset train = data::load_fashion_mnist(dir, data::Split::Train, {.limit = limit});
  DPE_CHECK(train.images.size(0) > 0, "the training set in ", dir, " is empty; expected at least one sample");
  data::Dataset test = with_test ? data::load_fashion_mnist(dir, data::Split::Test) : data::Dataset{};
  return {train.images, train.labels, test.images, test.labels};
}

namespace {

OptimizerFactory optimizer_factory(const OptimizerOptions& o) {
  DPE_CHECK(std::isfinite(o.lr) && o.lr > 0, "--lr ", o.lr, ": expected a finite number > 0");
  DPE_CHECK(std::isfinite(o.momentum) && o.momentum >= 0, "--momentum ", o.momentum, ": expected a finite number >= 0");
  DPE_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "--weight-decay ", o.weight_decay,
            ": expected a finite number >= 0");
  if (o.decay_matrices_only) {
    OptimizerOptions all = o;
    all.decay_matrices_only = false;
    return [all](const std::vector<Tensor>& p) {
      std::vector<Tensor> matrices, others;
      for (const Tensor& t : p) (t.dim() >= 2 ? matrices : others).push_back(t);
      std::unique_ptr<optim::Optimizer> optimizer = optimizer_factory(all)(matrices);
      if (!others.empty()) optimizer->add_param_group({.params = others, .options = {{"weight_decay", 0.0}}});
      return optimizer;
    };
  }
  if (o.name == "sgd") {
    return [o](const std::vector<Tensor>& p) {
      return std::make_unique<optim::SGD>(
          p, optim::SGDOptions{.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
    };
  }
  if (o.name == "adam") {
    return [o](const std::vector<Tensor>& p) {
      return std::make_unique<optim::Adam>(p, optim::AdamOptions{.lr = o.lr, .weight_decay = o.weight_decay});
    };
  }
  DPE_CHECK(o.name == "adamw", "--optimizer ", o.name, ": expected sgd, adam or adamw");
  return [o](const std::vector<Tensor>& p) {
    return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = o.lr, .weight_decay = o.weight_decay});
  };
}

}  // namespace

void check_channels_last(const std::string& model) {
  DPE_CHECK(model != "tiny-llama" && model != "llama", "--channels-last: the ", model, " model's inputs are token "
            "ids (N, T), not images (N, C, H, W); expected --model cnn or mlp");
}

void set_cudnn_benchmark(bool on, bool deterministic, const std::vector<Device>& devices) {
  const bool cuda = std::ranges::any_of(devices, [](const Device& d) { return d.is_cuda(); });
  DPE_CHECK(!(on && deterministic && cuda), "--cudnn-benchmark with --deterministic on CUDA devices: the deterministic "
            "mode needs cuDNN's deterministic algorithms, --cudnn-benchmark chooses them by speed; expected one of them");
  backends::cudnn::set_benchmark(on);
}

void check_ddp_batch(const std::string& option, int64_t batch, int64_t devices) {
  auto works = [&](int64_t b) { return static_cast<int64_t>(compute_chunk_sizes(b, devices).size()) == devices; };
  if (works(batch)) return;
  // Batches that fail lie in gaps of fewer than `devices` sizes (ceil(B/n) = k fails for (k-1) n < B <= k (n-1)),
  // so both searches end within `devices` steps.
  int64_t up = batch + 1;
  while (!works(up)) ++up;
  int64_t down = batch - 1;
  while (down >= devices && !works(down)) --down;
  const std::vector<int64_t> sizes = compute_chunk_sizes(batch, devices);
  std::string shards;
  for (size_t i = 0; i < sizes.size() && i < 8; ++i) shards += (i ? ", " : "") + std::to_string(sizes[i]);
  if (sizes.size() > 8) shards += ", ...";
  DPE_CHECK(false, option, " ", batch, " splits into ", sizes.size(), " shards (", shards,
            ") for ", devices, " DDP devices under the chunk rule; DDP needs a sample on every device: use ", option,
            " ", down >= devices ? std::to_string(down) + " or " : std::string(), up);
}

LossFn language_model_loss() {
  return [](const Tensor& logits, const Tensor& target) {
    return nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
  };
}

namespace {

// Parameters on cpu:0; the initial weights consume the default generator of cpu:0.
std::shared_ptr<nn::Module> build_model(const EngineOptions& options) {
  if (options.model == "llama") return std::make_shared<nn::Llama>(*options.llama);
  return models::make_model(options.model);
}

// --activation-checkpointing: the Llamas per block; mlp and cnn (Sequentials) in 3 segments, the cnn's blocks
// (convolution, ReLU, pool | convolution, BatchNorm, ReLU, pool | the classifier).
void set_activation_checkpointing(nn::Module& model) {
  if (auto* llama = dynamic_cast<nn::Llama*>(&model)) {
    llama->set_activation_checkpointing(true);
  } else if (auto* sequential = dynamic_cast<nn::Sequential*>(&model)) {
    sequential->set_checkpoint_segments(3);
  } else {
    DPE_INTERNAL_ASSERT(false, "--activation-checkpointing: no rule for this model");
  }
}

}  // namespace

void check_engine_options(const EngineOptions& options) {
  DPE_CHECK(std::find(kModes.begin(), kModes.end(), options.mode) != kModes.end(), "--mode ", options.mode,
            ": expected single, dp, ddp or auto");
  if (options.model == "llama") {
    DPE_CHECK(options.llama.has_value(), "the llama model needs its configuration (--llama-preset)");
    nn::check_llama_config(*options.llama);
  } else {
    models::check_model_name(options.model);
  }
  DPE_CHECK(!options.devices.empty(), "no devices");
  DPE_CHECK(options.timeout_s > 0 && options.timeout_s <= 1e7, "--timeout ", options.timeout_s,
            ": expected seconds in (0, 10000000]");
  DPE_CHECK(!options.sync_bn || options.mode == "ddp", "--sync-bn needs --mode ddp (SyncBatchNorm synchronises DDP "
            "replicas; DP computes BatchNorm statistics per replica, like PyTorch)");
  DPE_CHECK(!options.dist || options.mode == "dp" || options.mode == "ddp", "--dist ", backend_name(*options.dist), " needs --mode ddp or dp (--mode ",
            options.mode, options.mode == "single" ? " trains one device)" : " switches modes, which it cannot across processes)");
  if (options.deterministic) {
    DPE_CHECK(options.split == SplitRule::Chunk, "--deterministic cuts every batch into its own virtual shards; "
              "--split ", split_rule_name(options.split), " does not apply");
    DPE_CHECK(!options.dist, "--deterministic runs in one process; it cannot be combined with --dist");
  }
  check_precision(options.precision, options.devices);
  DPE_CHECK(std::find(kReduceDtypes.begin(), kReduceDtypes.end(), options.reduce_dtype) != kReduceDtypes.end(),
            "--reduce-dtype ", options.reduce_dtype, ": expected fp32, bf16 or fp16");
  DPE_CHECK(options.reduce_dtype == "fp32" || needs_ddp_shards(options.mode), "--reduce-dtype ", options.reduce_dtype,
            " compresses DDP's gradient all-reduce; --mode ", options.mode, " has none (use --mode ddp or auto)");
  DPE_CHECK(!options.output_device || options.mode == "dp", "--output-device ", *options.output_device,
            " is used only in dp mode (--mode ", options.mode, " has no output device)");
  DPE_CHECK(options.zero_stage >= 0 && options.zero_stage <= 2, "--zero ", options.zero_stage,
            ": expected 0 (none), 1 (optimizer state sharded) or 2 (and gradients)");
  DPE_CHECK(options.zero_stage == 0 || options.mode == "ddp", "--zero ", options.zero_stage, " shards DDP mode's "
            "optimizers; expected --mode ddp, got --mode ", options.mode);
}

io::TrainingState read_checkpoint_state(const EngineOptions& options, const OptimizerOptions& optimizer) {
  const std::vector<io::GeneratorState> generators = io::capture_rng_state();
  std::shared_ptr<nn::Module> model = build_model(options);
  if (options.sync_bn) model = nn::convert_sync_batchnorm(model);
  std::unique_ptr<optim::Optimizer> opt = optimizer_factory(optimizer)(model->parameters());
  io::TrainingState state;
  try {
    io::load_checkpoint(options.resume, *model, opt.get(), &state);
  } catch (...) {
    io::restore_rng_state(generators);
    throw;
  }
  io::restore_rng_state(generators);  // loading set them from the file; make_engine does that again
  return state;
}

SplitRule parse_split_rule(const std::string& name) {
  if (name == "balanced") return SplitRule::Balanced;
  if (name == "auto") return SplitRule::Auto;
  DPE_CHECK(name == "chunk", "--split ", name, ": expected chunk, balanced or auto");
  return SplitRule::Chunk;
}

DeviceFailurePolicy parse_device_failure_policy(const std::string& name) {
  if (name == "drop_device") return DeviceFailurePolicy::DropDevice;
  if (name == "retry_smaller_chunk") return DeviceFailurePolicy::RetrySmallerChunk;
  DPE_CHECK(name == "fail", "--on-device-failure ", name, ": expected fail, drop_device or retry_smaller_chunk");
  return DeviceFailurePolicy::Fail;
}

std::string auto_mode_summary(const StepReport& step) {
  if (!step.auto_mode || !step.auto_mode->chosen) return "";
  char text[128];
  std::snprintf(text, sizeof text, "auto: %s (dp %.2f ms/step, ddp %.2f ms/step)", mode_name(*step.auto_mode->chosen),
                step.auto_mode->dp_step_ms, step.auto_mode->ddp_step_ms);
  return text;
}

std::unique_ptr<DataParallel> make_engine(const EngineOptions& options, const OptimizerOptions& optimizer,
                                          int64_t* resumed_epoch) {
  check_engine_options(options);
  manual_seed(options.seed);
  std::shared_ptr<nn::Module> model = build_model(options);
  if (options.sync_bn) model = nn::convert_sync_batchnorm(model);
  if (options.activation_checkpointing) set_activation_checkpointing(*model);
  model->to(options.devices[0]);
  DataParallelOptions dp_options;
  dp_options.deterministic = options.deterministic;
  dp_options.virtual_shards = options.virtual_shards;
  dp_options.on_device_failure = options.on_device_failure;
  dp_options.timeout = std::chrono::milliseconds(std::max<int64_t>(1, std::llround(options.timeout_s * 1000)));
  if (options.reduce_dtype != "fp32") dp_options.reduce_dtype = options.reduce_dtype == "bf16" ? DType::BFloat16 : DType::Float16;
  if (options.mode == "single") {
    dp_options.device_ids = std::vector<Device>{options.devices[0]};
  } else {
    dp_options.device_ids = options.devices;
    dp_options.output_device = options.output_device;
    dp_options.split = options.split;
    if (options.mode == "ddp") dp_options.mode = ParallelMode::DDP;
    dp_options.zero_stage = options.zero_stage;
    if (options.mode == "auto") dp_options.mode = ParallelMode::Auto;
    if (options.dist) dp_options.backend = *options.dist;
  }
  io::TrainingState state;
  if (!options.resume.empty()) io::load_checkpoint(options.resume, *model, nullptr, &state);
  auto dp = std::make_unique<DataParallel>(model, dp_options);  // DDP: replica 0's (resumed) weights to all
  dp->set_optimizer(optimizer_factory(optimizer));
  if (options.precision == "fp16") {
    // float16 gradients need loss scaling (PyTorch's defaults); a resumed run continues the saved scale. A
    // checkpoint of a float32 or bfloat16 run has none: the scaler starts afresh.
    auto scaler = std::make_shared<optim::GradScaler>();
    if (!state.grad_scaler.empty()) scaler->load_state_dict(state.grad_scaler);
    dp->set_grad_scaler(std::move(scaler));
  }
  if (!options.resume.empty()) {
    size_t optimizers = options.mode == "ddp" ? dp->device_ids().size() : 1;
    for (size_t r = 0; r < optimizers; ++r) io::load_checkpoint(options.resume, dp->replica(r), &dp->optimizer(r));
    if (resumed_epoch) *resumed_epoch = state.epoch;
  }
  return dp;
}

ProcessSlice process_slice(DataParallel& dp, bool across_processes, int64_t batch_size) {
  const int64_t local = static_cast<int64_t>(dp.device_ids().size());
  const bool ddp = dp.mode() == ParallelMode::DDP || dp.mode_is_auto();  // auto runs DDP steps too
  ProcessSlice slice;
  if (across_processes) {
    const ProcessGroup& group = *dp.process_group();
    slice.count = group.world_size() / group.size();
    slice.index = group.global_rank(0) / group.size();
  }
  slice.parts = ddp ? slice.count * local : slice.count;
  slice.devices = slice.count * local;
  if (across_processes) {
    const int64_t parts = slice.parts;
    const std::string what = ddp ? detail::str_cat(parts, " DDP replicas (", slice.count, " processes x ", local,
                                                   " devices)")
                                 : detail::str_cat(parts, " processes");
    DPE_CHECK(batch_size % parts == 0, "--batch-size ", batch_size, " with --dist mpi: the global batch must be a "
              "multiple of the ", what, "; try ", std::max(parts, batch_size / parts * parts), " or ",
              (batch_size / parts + 1) * parts);
  }
  return slice;
}

Tensor ProcessSlice::of(const Tensor& batch) const {
  const int64_t rows = batch.size(0) / count;
  return batch.narrow(0, index * rows, rows);
}

void check_precision(const std::string& precision, const std::vector<Device>& devices) {
  DPE_CHECK(std::find(kPrecisions.begin(), kPrecisions.end(), precision) != kPrecisions.end(), "--precision ",
            precision, ": expected fp32, bf16 or fp16");
  if (precision != "fp16") return;
  for (const Device& d : devices) {
    DPE_CHECK(d.is_cuda(), "--precision fp16 runs on CUDA devices only (float16 products and a gradient scaler); got ",
              d, ": use --precision bf16 on CPU");
  }
}

PrecisionScope::PrecisionScope(const std::string& precision, const std::vector<Device>& devices) {
  if (precision == "fp32") return;
  DPE_CHECK(!devices.empty(), "--precision ", precision, ": no devices");
  autocast_.emplace(devices[0].kind, precision == "bf16" ? DType::BFloat16 : DType::Float16);
}

double test_accuracy(DataParallel& dp, const std::string& model, const Tensor& inputs, const Tensor& targets,
                     int64_t batch) {
  NoGradGuard no_grad;
  nn::Module& replica = dp.module();
  replica.eval();
  int64_t correct = 0, counted = 0;
  const Device device = dp.device_ids()[0];
  for (int64_t start = 0; start < inputs.size(0); start += batch) {
    int64_t n = std::min(batch, inputs.size(0) - start);
    Tensor logits = replica.forward(inputs.narrow(0, start, n).to(device)).to(Device::cpu(0));
    Tensor predicted = argmax(logits, -1);
    std::vector<int64_t> p = predicted.to_vector<int64_t>();
    std::vector<int64_t> t = targets.narrow(0, start, n).to_vector<int64_t>();
    for (size_t i = 0; i < p.size(); ++i) {
      if (model == "tiny-llama" && t[i] == data::kPad) continue;
      correct += p[i] == t[i];
      ++counted;
    }
  }
  replica.train();
  return counted == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(counted);
}

}  // namespace dpe::tool
