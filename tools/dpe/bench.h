// The parts of `dpe bench` (bench_command.cc, whose file comment says what it measures and why): its options,
// a row of its table, and the functions of its three jobs: running dpe's rows (bench_rows.cc), PyTorch's side
// (bench_pytorch.cc), the report (bench_report.cc).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd/profiler.h"
#include "core/device.h"
#include "tools/dpe/training.h"

namespace dpe::tool::bench {

// DDP with nothing exchanged (bench_command.cc's file comment says why it exists), and PyTorch's
// (pytorch_reference.py).
inline constexpr const char* kNoSyncMode = "ddp-no-sync";
inline constexpr const char* kPytorchNoSyncConfig = "ddp-gloo-no-sync";

// Modes whose replicas each take a shard of the batch (so every device needs a sample of it).
inline bool shards_per_replica(const std::string& mode) { return needs_ddp_shards(mode) || mode == kNoSyncMode; }

struct BenchArgs {
  std::string model = "mlp", json, csv, png, pytorch_script, data_dir;
  // --model llama: the preset and the tokens per row (0: the preset's longest); its configuration, resolved at
  // start-up. Its data are random tokens: a speed, not a learning, measurement.
  std::string llama_preset = "124m";
  int64_t seq_len = 0;
  int64_t dim = 0, layers = 0, heads = 0, kv_heads = 0;  // overrides of the preset (0: the preset's)
  std::optional<nn::LlamaConfig> llama;
  // The PyTorch side's interpreter, run directly (never through a shell): Debian's, which has python3-torch.
  std::string pytorch_python = "/usr/bin/python3";
  double pytorch_timeout = 3600;  // seconds the PyTorch side may run
  std::optional<std::string> device_ids;
  std::vector<std::string> modes = {"single", "dp", "ddp"};
  bool activation_checkpointing = false;  // rows ddp-ac, ...
  std::string optimizer;  // --optimizer: sgd (momentum), adam, adamw; "": adamw for llama, sgd otherwise
  std::vector<std::string> pytorch_configs = {"single-1t", "single-2t", "ddp-gloo"};
  int64_t batch_size = 256, steps = 30, warmup = 5, repeat = 1;
  int cpu_devices = 2;
  bool cpu_devices_given = false;  // --cpu-devices given: CPU devices even where there is a GPU
  bool compare_pytorch = false;
  std::string dist = "none";  // "mpi": DDP over the devices of every process of an MPI launch
  std::string split = "chunk";  // dp and ddp's split rule: chunk, balanced, auto
  bool deterministic = false;   // dp and ddp in the deterministic mode (rows dp-det, ddp-det)
  int64_t virtual_shards = 0;
  std::vector<std::string> precisions = {"fp32"};  // every mode in each (rows ddp, ddp-bf16, ...)
  std::string reduce_dtype = "fp32";  // ddp's bucket dtype (rows ddp-r16 with bf16 or fp16)
  bool profile = false;  // after each mode's timed steps, as many again with the backward profiled
  bool channels_last = false;  // the inputs in channels-last memory (rows ddp-cl, ...)
  bool cudnn_benchmark = false;  // cuDNN's convolution algorithms measured (core/backends.h)
};

struct Row {
  std::string framework = "dpe", config, precision = "fp32";
  std::string mode;  // dpe rows: the --modes entry (config adds the run's suffixes: -cl, -det, -bf16, ...)
  int devices = 1;
  double samples_per_s = 0, step_ms = 0;
  std::optional<double> scaling;  // against the single row of the same precision; none without one
  StepReport phases;  // per-step averages of the timed steps (ms), bytes per step
  std::vector<std::pair<Device, int64_t>> peak;  // peak allocated bytes per device during the timed steps
  // Per device: the peak's bytes by MemoryKind (indexed by its value), as the allocator tagged them.
  std::vector<std::array<int64_t, kMemoryKinds>> peak_split;
  // PyTorch rows on CPUs: each process's peak resident set, by rank (pytorch_reference.py); no allocator there.
  std::vector<int64_t> peak_rss;
  // PyTorch rows on a GPU: torch.cuda.max_memory_allocated() over the run (pytorch_reference.py); 0 elsewhere.
  int64_t peak_cuda = 0;
  std::string note;
  bool reports = true;  // --dist mpi: only process 0's rows are shown and written
  int64_t processes = 1;  // --dist mpi: the processes whose devices the row counts
  std::vector<double> split_weights, ms_per_sample;  // --split auto: after the last timed step
  std::vector<autograd::NodeTime> backward_profile;  // --profile: summed over its steps and devices
  int64_t profiled_steps = 0;
  // --repeat: every round's measurement of this row, in round order (the row itself is the median one).
  struct Round {
    std::string config;  // auto may choose another mode in another round
    double samples_per_s = 0;
    std::optional<double> scaling;
  };
  std::vector<Round> rounds;
};

// Tokens per sample (llama: the row's tokens; 1 for the other models) and training FLOPs per sample (the
// model's matrix products and, for llama, attention: layers/llama.h's llama_size).
int64_t tokens_per_sample(const BenchArgs& args);
double flops_per_sample(const BenchArgs& args);
// --model llama: `rows` windows of random tokens of the preset's vocabulary (seed 0), inputs and next tokens.
ModelData random_tokens(const BenchArgs& args, int64_t rows);

// ---- running dpe's rows (bench_rows.cc) ----

// --optimizer's optimizer (the default: llama's AdamW with decay on matrices, the other models' SGD-momentum).
OptimizerOptions bench_optimizer(const BenchArgs& args);

// One row: `mode` (single, single-all, dp, ddp, ddp-no-sync, auto) in `precision` on `devices`: its warm-up,
// then its timed steps over `data`'s training set (and as many again profiled, with --profile).
Row bench_mode(const BenchArgs& args, const std::string& mode, const std::string& precision,
               const std::vector<Device>& devices, const ModelData& data);
// Scaling: against the single-device row of the same precision (and the run's other flags, which every row
// shares) of the same round.
void set_scaling(std::vector<Row>& rows);
// --repeat: each row's median round, with every round's figures attached (bench_command.cc says which). The
// rounds ran the same modes and PyTorch configurations in the same order.
std::vector<Row> median_rounds(std::vector<std::vector<Row>> rounds);

// ---- PyTorch's side (bench_pytorch.cc) ----

// The configurations tools/bench/pytorch_reference.py knows (its parse_config): single, single-Nt (N >= 1
// threads) and kPytorchNamedConfigs. Checked at start-up, so that a typo fails before dpe's runs.
inline constexpr std::array<const char*, 6> kPytorchNamedConfigs = {
    "cuda", "cuda-bf16", "cuda-bf16-compile", "dp", "ddp-gloo", kPytorchNoSyncConfig};
bool is_pytorch_config(const std::string& c);
// "single, single-Nt<threads>, cuda, ..., <last_separator>ddp-gloo-no-sync": every configuration, for the help
// and the errors.
std::string pytorch_config_list(const std::string& threads, const std::string& last_separator);
// --pytorch-script, or the repository's tools/bench/pytorch_reference.py.
std::string pytorch_script_path(const BenchArgs& args);
// PyTorch's rows: the script run (python3, an argument vector, under --pytorch-timeout) on the first `samples`
// training samples; throws naming the command and what failed.
std::vector<Row> bench_pytorch(const BenchArgs& args, int64_t samples);

// ---- the report (bench_report.cc) ----

// The table, then the exchanges' costs, the FMA-peak limit and the GEMM choices (CPU devices).
void print_table(const BenchArgs& args, const std::vector<Row>& rows);
// --repeat: every round of every row.
void print_rounds(const std::vector<Row>& rows);
// --split auto: the weights each row settled on, per device.
void print_split_weights(const std::vector<Row>& rows, const std::vector<Device>& devices);
// --profile: a row's backward by node kind, per step, the largest first.
void print_backward_profile(const Row& r, const std::vector<Device>& devices);
// --json, --csv, --png.
void write_outputs(const BenchArgs& args, const std::vector<Row>& rows);

}  // namespace dpe::tool::bench
