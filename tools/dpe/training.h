// What `dpe train` and `dpe bench` share: the data of each built-in model, the engine for a mode, the
// optimizer, test accuracy. Modes: "single" (DataParallel on the first device alone: the module's own
// forward, nothing scattered or reduced), "dp", "ddp".
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/amp/autocast.h"
#include "engine/data_parallel.h"
#include "io/checkpoint.h"
#include "layers/llama.h"

namespace dpe::tool {

// --model's values for dpe train: the built-in models (models/models.h) and llama, a Llama of a preset
// (layers/llama.h) trained on token shards (tools/dpe/train_llm.h).
inline const std::vector<std::string> kTrainModels = {"mlp", "cnn", "tiny-llama", "llama"};

// auto: DataParallel's ParallelMode::Auto (times dp and ddp for a few steps, keeps the faster).
inline const std::vector<std::string> kModes = {"single", "dp", "ddp", "auto"};
// Modes whose steps split every batch over the devices' DDP replicas at least part of the time (every
// replica needs a sample): ddp and auto.
inline bool needs_ddp_shards(const std::string& mode) {
  return mode == "ddp" || mode == "auto" || mode == "ddp-zero1" || mode == "ddp-zero2";
}
// --split's values: chunk (PyTorch's), balanced, auto (chunks follow the devices' measured speeds).
inline const std::vector<std::string> kSplitRules = {"chunk", "balanced", "auto"};
SplitRule parse_split_rule(const std::string& name);
// --on-device-failure's values: fail, drop_device, retry_smaller_chunk (DeviceFailurePolicy).
inline const std::vector<std::string> kDeviceFailurePolicies = {"fail", "drop_device", "retry_smaller_chunk"};
DeviceFailurePolicy parse_device_failure_policy(const std::string& name);
// --precision's values (docs/MIXED_PRECISION.md): fp32; bf16 (autocast's bfloat16 products, CPU and CUDA);
// fp16 (CUDA only: float16 products and a gradient scaler).
inline const std::vector<std::string> kPrecisions = {"fp32", "bf16", "fp16"};
// --reduce-dtype's values: DataParallelOptions::reduce_dtype as float32, bfloat16, float16.
inline const std::vector<std::string> kReduceDtypes = {"fp32", "bf16", "fp16"};
// Throws unless `precision` is one of them and the devices can run it (fp16: CUDA only), naming both.
void check_precision(const std::string& precision, const std::vector<Device>& devices);
// Autocast for --precision on `devices` (all of one kind) for the guard's scope; nothing for fp32.
class PrecisionScope {
 public:
  PrecisionScope(const std::string& precision, const std::vector<Device>& devices);

 private:
  std::optional<amp::AutocastGuard> autocast_;
};
// "auto: ddp (dp 12.3 ms/step, ddp 9.8 ms/step)" once ParallelMode::Auto has chosen; "" before or without it.
std::string auto_mode_summary(const StepReport& step);

// Train and test tensors for a model: Fashion-MNIST for mlp/cnn (images, labels), the fortunes corpus for
// tiny-llama (token sequences, next tokens; the last tenth of the records is the test split).
struct ModelData {
  Tensor train_inputs, train_targets, test_inputs, test_targets;
};
// limit: at most this many training samples (all when < 0); the test split is kept whole (at most 10000),
// or not loaded at all without with_test. Throws when the training split is empty.
ModelData load_model_data(const std::string& model, const std::string& data_dir, int64_t limit, bool with_test = true);

// A language model's loss: cross-entropy of logits (B, T, V) against next tokens (B, T), the mean over every
// position whose target is not -100 (PyTorch's ignore_index).
LossFn language_model_loss();

// DDP needs every replica to get at least one sample of every batch. Under the chunk rule
// (scatter_gather/chunking.h) some batches leave devices empty (4 on 3 devices: 2, 2): throws for those,
// naming `option`, the shards and the nearest batch sizes that work. Cheap: checked before anything is built.
void check_ddp_batch(const std::string& option, int64_t batch, int64_t devices);

// --channels-last: the model's inputs must be images (N, C, H, W); throws naming the model otherwise.
void check_channels_last(const std::string& model);

// --cudnn-benchmark (core/backends.h, torch.backends.cudnn.benchmark): refused beside --deterministic on CUDA
// devices, whose deterministic mode needs cuDNN's deterministic algorithms; then sets backends::cudnn::benchmark.
void set_cudnn_benchmark(bool on, bool deterministic, const std::vector<Device>& devices);
inline constexpr const char* kCudnnBenchmarkHelp =
    "CUDA devices: time every cuDNN convolution algorithm once per shape and keep the fastest, as "
    "torch.backends.cudnn.benchmark = True (default: cuDNN's heuristics, deterministic algorithms first)";

inline constexpr const char* kActivationCheckpointingHelp =
    "keep only each block's input in the forward and run the block again in the backward (llama: per block; mlp, "
    "cnn: 3 segments): less activation memory for more compute, the same results";

struct EngineOptions {
  std::string model = "cnn";
  std::string mode = "ddp";
  std::vector<Device> devices;          // all of them for dp/ddp; single uses devices[0]
  std::optional<Device> output_device;  // dp only
  bool sync_bn = false;                 // ddp: BatchNorm -> SyncBatchNorm
  SplitRule split = SplitRule::Chunk;    // --split: dp/ddp's split rule (chunk, balanced, auto)
  bool deterministic = false;            // --deterministic: dp/ddp's deterministic mode
  int64_t virtual_shards = 0;            // --virtual-shards (0: the engine's default)
  DeviceFailurePolicy on_device_failure = DeviceFailurePolicy::Fail;  // --on-device-failure
  double timeout_s = 300;                // --timeout: DataParallelOptions::timeout, in seconds
  std::string precision = "fp32";        // --precision: fp32, bf16 or fp16 (kPrecisions)
  std::string reduce_dtype = "fp32";     // --reduce-dtype: the dtype DDP's gradient buckets travel in
  std::optional<CollectiveBackend> dist;  // --dist mpi, mpi-nccl: dp/ddp over the devices of every process
  int zero_stage = 0;                     // --zero: ddp's ZeRO stage (DataParallelOptions::zero_stage)
  bool activation_checkpointing = false;  // --activation-checkpointing (training.cc says which blocks)
  uint64_t seed = 0;                    // initial weights
  std::string resume;                   // checkpoint to start from (model and optimizer)
  std::optional<nn::LlamaConfig> llama;  // model "llama": its configuration (required)
};
struct OptimizerOptions {
  std::string name = "sgd";  // sgd (momentum), adam, adamw
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 0.0;
  // Weight decay on matrices only (parameters of 2 or more dimensions: the GEMMs' weights and the embedding),
  // none on norms' gains and biases: nanoGPT's and the tutorials' two param groups, decayed one first.
  bool decay_matrices_only = false;
};

// Throws on options make_engine would refuse after building a model (unknown mode or model, no devices,
// --sync-bn outside DDP); cheap, so commands call it first.
void check_engine_options(const EngineOptions& options);

// The engine with its optimizer(s) set; resumed from options.resume when given (every replica's optimizer
// gets the saved state). Returns the training state stored in the checkpoint (epoch, step) when resuming.
std::unique_ptr<DataParallel> make_engine(const EngineOptions& options, const OptimizerOptions& optimizer,
                                          int64_t* resumed_epoch = nullptr);

// The training state (epoch, step) of the checkpoint options.resume, read without building the engine: the
// file is validated against a freshly built model on cpu:0 and its optimizer (the same checks as
// make_engine's load: a checkpoint of another model or optimizer is refused before data is loaded). The
// default generators are left as they were.
io::TrainingState read_checkpoint_state(const EngineOptions& options, const OptimizerOptions& optimizer);

// Where this process stands among those that train together (--dist mpi; one process otherwise). Every
// process iterates the same global batches (same seed) and trains on its slice of each, which gives every
// replica the shard it would have in one process with all the devices (DistributedSampler's partition, batch
// by batch). The group spanning the processes is the DDP replicas' or the DP masters' (one per process).
struct ProcessSlice {
  int64_t count = 1, index = 0;  // processes, and this one's place among them
  // What every global batch must split into evenly: a shard per DDP replica of every process; across
  // processes in DP mode, a slice per process; else 1.
  int64_t parts = 1;
  int64_t devices = 1;  // over every process
  bool reports() const { return index == 0; }  // process 0 prints, evaluates and writes
  // This process's rows of a global batch (a view).
  Tensor of(const Tensor& batch) const;
};
// With --dist mpi, `batch_size` must be a multiple of `parts`: throws naming --batch-size and the nearest sizes.
ProcessSlice process_slice(DataParallel& dp, bool across_processes, int64_t batch_size);

// Fraction of correct argmax predictions (for tiny-llama: of non-padding next tokens), computed with
// replica 0 in eval mode on its device, in batches of `batch`.
double test_accuracy(DataParallel& dp, const std::string& model, const Tensor& inputs, const Tensor& targets,
                     int64_t batch = 1000);

}  // namespace dpe::tool
