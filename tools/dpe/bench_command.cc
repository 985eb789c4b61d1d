// dpe bench: the same model, data and global batch in single-device, DP and DDP mode (and, with
// --compare-pytorch, PyTorch's own configurations in the same run), warm-up excluded, in one table:
// samples/s, scaling efficiency against one device, milliseconds per phase, bytes moved, peak memory per
// device (its peak allocation during the timed steps: model, gradients, optimizer state, activations,
// copies; the input data set held on cpu:0 is not counted). --json, --csv and --png (gnuplot) write the
// same rows; every option, output path and PyTorch configuration is checked before anything runs, and the
// programs it starts (python3, gnuplot) get argument vectors, never a shell (tools/dpe/subprocess.h).
//
// "One device" gets one device's share of the machine: on CPU devices, cores / number of devices threads,
// the share each device has in DP and DDP mode, so the scaling efficiency compares like with like. The
// "single-all" mode runs one device on every core. The "ddp-no-sync" mode is DDP with every backward inside
// no_sync() and every replica stepping its own optimizer on its own gradients: the same workers, shards and
// optimizers with nothing exchanged, so its scaling is the most data parallelism can get from these devices
// (memory bandwidth and caches shared between the cores included), and dp and ddp are also shown as a share
// of it, the cost of their exchanges (fp16 still combines the gradient scaler's skip flags). It trains nothing
// useful (the replicas drift apart); it is a bound.
//
// --profile runs as many steps again after each mode's timed ones with the backward profiled
// (core/autograd/profiler.h) and prints, per mode, where the backward's time goes by node kind.
//
// --repeat N runs every row N times in interleaved rounds (round 1 runs every mode and then PyTorch's
// configurations, then round 2, ...), so that a slow phase of a shared machine falls on every row alike instead
// of on whichever row ran during it. Each row shows its median round (the lower middle one for an even N:
// a round that was measured, whose phases, memory and profile belong to it); its scaling is the median of the
// rounds' own ratios (a row against the single row of the same round), and a line per row lists every round.
#include <cblas.h>
#include <omp.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>


#include "bench/fma_peak.h"
#include "core/allocator.h"
#include "core/autograd/profiler.h"
#include "core/backends.h"
#include "core/cpu_cores.h"
#include "core/cpu_isa.h"
#include "core/kernels/sgemm_choice.h"
#include "engine/worker_pool.h"
#include "models/models.h"
#include "tools/dpe/cli_util.h"
#include "tools/dpe/file_args.h"
#include "tools/dpe/commands.h"
#include "tools/dpe/dist_option.h"
#include "tools/dpe/json_report.h"
#include "tools/dpe/subprocess.h"
#include "tools/dpe/training.h"

namespace dpe::tool {

namespace {

// DDP with nothing exchanged (the file's comment says why it exists), and PyTorch's (pytorch_reference.py).
constexpr const char* kNoSyncMode = "ddp-no-sync";
constexpr const char* kPytorchNoSyncConfig = "ddp-gloo-no-sync";

// Modes whose replicas each take a shard of the batch (so every device needs a sample of it).
bool shards_per_replica(const std::string& mode) { return needs_ddp_shards(mode) || mode == kNoSyncMode; }

struct BenchArgs {
  std::string model = "mlp", json, csv, png, pytorch_script, data_dir;
  // The PyTorch side's interpreter, run directly (never through a shell): Debian's, which has python3-torch.
  std::string pytorch_python = "/usr/bin/python3";
  double pytorch_timeout = 3600;  // seconds the PyTorch side may run
  std::optional<std::string> device_ids;
  std::vector<std::string> modes = {"single", "dp", "ddp"};
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

// The configurations tools/bench/pytorch_reference.py knows (its parse_config): single, single-Nt (N >= 1
// threads), cuda, dp, ddp-gloo, ddp-gloo-no-sync. Checked here so that a typo fails at start-up, not after
// dpe's own runs.
bool is_pytorch_config(const std::string& c) {
  if (c == "single" || c == "cuda" || c == "dp" || c == "ddp-gloo" || c == kPytorchNoSyncConfig) return true;
  if (c.size() < 9 || c.rfind("single-", 0) != 0 || c.back() != 't') return false;
  const std::string threads = c.substr(7, c.size() - 8);
  if (threads.size() > 4 || !std::all_of(threads.begin(), threads.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return false;
  }
  return std::stoi(threads) > 0;
}

std::string pytorch_script_path(const BenchArgs& args) {
  if (!args.pytorch_script.empty()) return args.pytorch_script;
  const char* root = std::getenv("BUILD_WORKSPACE_DIRECTORY");  // set by `bazel run`
  return std::string(root ? root : ".") + "/tools/bench/pytorch_reference.py";
}

// Text for a gnuplot double-quoted string or datablock label: letters, digits, space and "._-+" pass, anything
// else becomes '?', so no label can end the string (the values come from known lists; this is a backstop).
std::string gnuplot_label(const std::string& text) {
  std::string out;
  for (char c : text) out += std::isalnum(static_cast<unsigned char>(c)) || std::strchr(" ._-+", c) ? c : '?';
  return out;
}

struct Row {
  std::string framework = "dpe", config, precision = "fp32";
  std::string mode;  // dpe rows: the --modes entry (config adds the run's suffixes: -cl, -det, -bf16, ...)
  int devices = 1;
  double samples_per_s = 0, step_ms = 0;
  std::optional<double> scaling;  // against the single row of the same precision; none without one
  StepReport phases;  // per-step averages of the timed steps (ms), bytes per step
  std::vector<std::pair<Device, int64_t>> peak;  // peak allocated bytes per device during the timed steps
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

// Runs fn on a thread limited to `threads` intra-op threads (oneTBB arena and OpenMP), pinned to `cores` when
// there are any (then one thread per core), as the engine's worker for the same device would be
// (engine/worker_pool.h), so that a one-device row uses one device's share of the cores.
void with_threads(int threads, const std::vector<int>& cores, const std::function<void()>& fn) {
  std::exception_ptr failure;
  std::thread t([&] {
    try {
      if (!cores.empty()) {
        const int rc = pin_this_thread(cores);
        DPE_CHECK(rc == 0, "dpe bench: could not pin the single row's thread to DPE_CPU_DEVICE_CORES's cores: ",
                  std::strerror(rc));
        // Read back, not echoed: what the thread's mask now is.
        std::string on;
        for (int core : usable_cpus()) on += (on.empty() ? "" : ",") + std::to_string(core);
        std::fprintf(stderr, "bench: single runs on core(s) %s (DPE_CPU_DEVICE_CORES), %zu intra-op thread(s)\n",
                     on.c_str(), cores.size());
      }
      const int n = cores.empty() ? threads : static_cast<int>(cores.size());
      omp_set_num_threads(n);
      tbb::task_arena arena(n);
      arena.execute(fn);
    } catch (...) {
      failure = std::current_exception();
    }
  });
  t.join();
  if (failure) std::rethrow_exception(failure);
}

void accumulate(StepReport& sum, const StepReport& s, double scale) {
  sum.scatter_ms += s.scatter_ms * scale;
  sum.broadcast_ms += s.broadcast_ms * scale;
  sum.forward_ms += s.forward_ms * scale;
  sum.gather_ms += s.gather_ms * scale;
  sum.loss_ms += s.loss_ms * scale;
  sum.backward_ms += s.backward_ms * scale;
  sum.reduce_ms += s.reduce_ms * scale;
  sum.optimizer_ms += s.optimizer_ms * scale;
  sum.scatter.bytes += static_cast<int64_t>(static_cast<double>(s.scatter.bytes) * scale);
  sum.broadcast.bytes += static_cast<int64_t>(static_cast<double>(s.broadcast.bytes) * scale);
  sum.gather.bytes += static_cast<int64_t>(static_cast<double>(s.gather.bytes) * scale);
  sum.reduce.bytes += static_cast<int64_t>(static_cast<double>(s.reduce.bytes) * scale);
}

Row bench_mode(const BenchArgs& args, const std::string& mode, const std::string& precision,
               const std::vector<Device>& devices, const ModelData& data) {
  Row row;
  row.config = row.mode = mode;
  row.precision = precision;
  const bool no_sync = mode == kNoSyncMode;
  const std::string engine_mode = mode == "single-all" ? "single" : no_sync ? "ddp" : mode;
  const std::optional<CollectiveBackend> dist = dist_backend(args.dist, devices);
  const bool across_processes = dist.has_value();
  std::unique_ptr<DataParallel> dp = make_engine(
      {.model = args.model, .mode = engine_mode, .devices = devices, .split = parse_split_rule(args.split),
       .deterministic = args.deterministic, .virtual_shards = args.virtual_shards,
       .precision = precision, .reduce_dtype = needs_ddp_shards(mode) ? args.reduce_dtype : "fp32", .dist = dist,
       .seed = 1},
      {.lr = 0.01});
  // --dist mpi: every process takes its slice of each global batch (training.h, as dpe train does); the row
  // is the whole group's: its devices over every process, the global batch's samples/s.
  const ProcessSlice slice = process_slice(*dp, across_processes, args.batch_size);
  row.devices = static_cast<int>(slice.devices);
  row.reports = slice.reports();
  row.processes = slice.count;
  if (across_processes) row.config = mode + "-" + args.dist;  // ddp-mpi, ddp-mpi-nccl
  if (args.deterministic) row.config += "-det";
  if (args.channels_last) row.config += "-cl";
  const std::string precision_suffix = (precision == "fp32" ? "" : "-" + precision) +
                                       (needs_ddp_shards(mode) && args.reduce_dtype != "fp32" ? "-r" + args.reduce_dtype : "");
  row.config += precision_suffix;
  LossFn loss = models::model_loss(args.model);
  const int64_t n = data.train_inputs.size(0);
  auto batch_at = [&](int64_t step) {
    const int64_t start = step * args.batch_size % std::max<int64_t>(1, n - args.batch_size + 1);
    return std::pair{slice.of(data.train_inputs.narrow(0, start, args.batch_size)),
                     slice.of(data.train_targets.narrow(0, start, args.batch_size))};
  };
  auto run = [&] {
    // auto: the warm-up lasts until it has chosen, so that the timed steps are the chosen mode's.
    auto chosen = [&] { return dp->last_step().auto_mode && dp->last_step().auto_mode->chosen; };
    // --precision: autocast per step, as dpe train does.
    auto step = [&](int64_t s) {
      auto [x, y] = batch_at(s);
      PrecisionScope autocast(precision, devices);
      if (!no_sync) {
        dp->train_step(x, y, loss);
        return;
      }
      dp->zero_grad();
      {
        NoSyncGuard local_gradients = dp->no_sync();
        dp->forward_backward(x, y, loss);
      }
      dp->optimizer_step();  // each replica on its own gradients
    };
    for (int64_t s = 0; s < args.warmup || (dp->mode_is_auto() && !chosen()); ++s) step(s);
    for (const Device& d : dp->device_ids()) reset_peak_memory_stats(d);
    auto start = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < args.steps; ++s) {
      step(args.warmup + s);
      accumulate(row.phases, dp->last_step(), 1.0 / static_cast<double>(args.steps));
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (dp->mode_is_auto()) row.config = std::string("auto->") + mode_name(dp->mode()) + precision_suffix;
    row.split_weights = dp->last_step().split_weights;
    row.ms_per_sample = dp->last_step().ms_per_sample;
    row.step_ms = seconds * 1e3 / static_cast<double>(args.steps);
    row.samples_per_s = static_cast<double>(args.batch_size * args.steps) / seconds;
    // The timed steps' peaks. The input data set lives on cpu:0 for the whole run; it is not the step's memory
    // (pinned, it is counted by the pinned allocator, not by cpu:0).
    const int64_t data_bytes = data.train_inputs.is_pinned()
                                   ? 0
                                   : static_cast<int64_t>(data.train_inputs.nbytes() + data.train_targets.nbytes());
    for (const Device& d : dp->device_ids()) {
      const int64_t peak = memory_stats(d).peak_allocated_bytes;
      row.peak.emplace_back(d, d == data.train_inputs.device() ? peak - data_bytes : peak);
    }
    if (args.profile) {
      // Separate steps: profiling synchronises each backward pass, which the timed steps must not pay.
      autograd::clear_backward_profile();
      autograd::enable_backward_profile(true);
      for (int64_t s = 0; s < args.steps; ++s) step(args.warmup + args.steps + s);
      autograd::enable_backward_profile(false);
      row.backward_profile = autograd::backward_profile();
      row.profiled_steps = args.steps;
    }
  };
  bool cpu = devices[0].is_cpu();
  if (mode == "single" && cpu) {
    // A device's share of the cores, or its pinned cores, as the engine's worker pool gives each CPU device.
    with_threads(std::max(1, usable_cores() / static_cast<int>(devices.size())), pinned_cpu_device_cores(devices[0]),
                 run);
  } else {
    run();  // single-all: the caller's thread with every core; dp/ddp: the engine's workers
  }
  return row;
}

// Scaling: against the single-device row of the same precision (and the run's other flags, which every row
// shares) of the same round.
void set_scaling(std::vector<Row>& rows) {
  for (Row& r : rows) {
    for (const Row& single : rows) {
      if (single.precision == r.precision && single.mode == "single") {
        r.scaling = r.samples_per_s / (single.samples_per_s * r.devices);
      }
    }
  }
}

// The lower middle of `values` (the median for an odd count).
template <typename T, typename Key>
T lower_median(std::vector<T> values, Key key) {
  std::ranges::stable_sort(values, {}, key);
  return values[(values.size() - 1) / 2];
}

// --repeat: each row's median round, with every round's figures attached (the file comment says which). The
// rounds ran the same modes and PyTorch configurations in the same order.
std::vector<Row> median_rounds(std::vector<std::vector<Row>> rounds) {
  std::vector<Row> rows;
  const std::vector<Row>& first = rounds.front();
  for (size_t i = 0; i < first.size(); ++i) {
    std::vector<Row*> measured;
    std::vector<Row::Round> history;
    for (std::vector<Row>& round : rounds) {
      DPE_CHECK(round.size() == first.size() && round[i].framework == first[i].framework &&
                    round[i].mode == first[i].mode && round[i].precision == first[i].precision &&
                    (round[i].framework == "dpe" || round[i].config == first[i].config),
                "dpe bench --repeat: round ", history.size() + 1, " has ", round.size(), " rows where round 1 has ",
                first.size(), ", or another row ", i + 1, " than its ", first[i].framework, " ", first[i].config,
                " (did the PyTorch script report other configurations?)");
      measured.push_back(&round[i]);
      history.push_back({round[i].config, round[i].samples_per_s, round[i].scaling});
    }
    Row row = std::move(*lower_median(measured, [](const Row* r) { return r->samples_per_s; }));
    if (std::ranges::all_of(history, [](const Row::Round& r) { return r.scaling.has_value(); })) {
      row.scaling = lower_median(history, [](const Row::Round& r) { return *r.scaling; }).scaling;
    }
    if (rounds.size() > 1) row.rounds = std::move(history);
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<Row> bench_pytorch(const BenchArgs& args, int64_t samples) {
  const std::string configs = join_commas(args.pytorch_configs);
  // An argument vector: the script path and every value reach python3 verbatim, whatever they contain.
  std::vector<std::string> argv = {args.pytorch_python, pytorch_script_path(args), "--model", args.model,
                                   "--batch", std::to_string(args.batch_size), "--steps",
                                   std::to_string(args.steps), "--warmup", std::to_string(args.warmup),
                                   "--samples", std::to_string(samples), "--configs", configs};
  if (!args.data_dir.empty()) argv.insert(argv.end(), {"--data-dir", args.data_dir});
  // Not --channels-last even when dpe's rows are: PyTorch 1.13's CPU CNN is slower in it (docs/BENCHMARKS.md,
  // "Channels last"), and the comparison is against PyTorch's best configuration.
  std::string shown;
  for (const std::string& a : argv) shown += (shown.empty() ? "" : " ") + a;
  std::fprintf(stderr, "running PyTorch: %s\n", shown.c_str());
  ProcessResult result = run_process(argv, {}, {.seconds = args.pytorch_timeout, .output_bytes = size_t{64} << 20});
  std::vector<Row> rows;
  for (const std::string& line : split_lines(result.output)) {
    // One JSON object per configuration; anything else on stdout is not a result.
    const JsonReport r = JsonReport::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!r.is_object() || r.value("framework", "") != "pytorch") continue;
    auto number = [&](const char* key) { return r.contains(key) && r[key].is_number() ? r[key].get<double>() : 0.0; };
    Row row;
    row.framework = "pytorch";
    row.config = r.value("config", "?");
    row.devices = static_cast<int>(std::max(1.0, number("processes")));
    row.samples_per_s = number("samples_per_s");
    row.step_ms = number("step_ms");
    if (r.contains("skipped")) row.note = "skipped";
    rows.push_back(row);
  }
  DPE_CHECK(result.ok() && !rows.empty(), "--compare-pytorch: ", shown, " failed (", describe_status(result), ", ",
            rows.size(), " result rows)",
            result.timed_out         ? "; --pytorch-timeout gives it longer"
            : result.output_exceeded ? ""
                                     : "; it needs Debian's python3-torch (apt-get install python3-torch)");
  return rows;
}

std::string mb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / 1e6);
  return buf;
}

// DPE_PEAK_GFLOPS: the machine's FMA peak in GFLOP/s, all cores together, where the user states it (a
// figure from the CPU's data sheet, say); unset: measured (machine_peak). Set but not a positive number:
// an error naming the value.
std::optional<double> peak_override() {
  const char* env = std::getenv("DPE_PEAK_GFLOPS");
  if (env == nullptr) return std::nullopt;
  char* end = nullptr;
  const double gflops = std::strtod(env, &end);
  DPE_CHECK(*env != '\0' && *end == '\0' && std::isfinite(gflops) && gflops > 0, "DPE_PEAK_GFLOPS='", env,
            "' is not a positive number of GFLOP/s (the machine's FMA peak, all cores; unset it to measure)");
  return gflops;
}

struct PeakFlops {
  double gflops;       // all cores
  std::string source;  // how it was found, for the table
};

// The FMA peak of the machine: DPE_PEAK_GFLOPS, else every CPU of the affinity mask probed at once with the
// widest vectors dpe runs (bench/fma_peak.h: AVX-512 where cpu_isa() has it, though dpe is compiled for AVX2).
// --dist mpi: process 0 prints, so its CPUs times the processes, each taken to have as many and as fast.
PeakFlops machine_peak(int64_t processes) {
  char text[240];
  if (std::optional<double> gflops = peak_override()) {
    std::snprintf(text, sizeof text, "%.1f GFLOP/s from DPE_PEAK_GFLOPS", *gflops);
    return {*gflops, text};
  }
  const bench::MachinePeak peak = bench::probe_fma_peak_every_cpu();
  const auto [slowest, fastest] = std::minmax_element(peak.per_cpu.begin(), peak.per_cpu.end());
  const int n = peak.cpus.size() == 1
                    ? std::snprintf(text, sizeof text, "%s FMA probe on 1 CPU: %.1f GFLOP/s", peak.isa.c_str(),
                                    peak.gflops)
                    : std::snprintf(text, sizeof text, "%s FMA probe on %zu CPUs at once: %.1f-%.1f GFLOP/s each, "
                                    "%.1f GFLOP/s", peak.isa.c_str(), peak.cpus.size(), *slowest, *fastest, peak.gflops);
  if (processes > 1 && n > 0 && static_cast<size_t>(n) < sizeof text) {
    std::snprintf(text + n, sizeof text - n, ", x %lld processes (process 0's) = %.1f GFLOP/s",
                  static_cast<long long>(processes), peak.gflops * static_cast<double>(processes));
  }
  return {peak.gflops * static_cast<double>(processes), text};
}

// Which library ran each float32 GEMM shape of this process's devices (Note [float32 GEMM choice] in
// core/kernels/sgemm_cpu.cc), with what each candidate measured.
void print_sgemm_choices() {
  const kernels::SgemmPolicy policy = kernels::current_sgemm_policy();
  const char* source = std::getenv("DPE_CPU_SGEMM") && *std::getenv("DPE_CPU_SGEMM") ? "DPE_CPU_SGEMM" : "the default";
  if (policy == kernels::SgemmPolicy::Onednn) {
    std::printf("# float32 GEMM: onednn (%s): oneDNN's matmul primitive for A @ B^T of >= %.0e FLOP (Linear's "
                "forward), dnnl_sgemm for the rest; DPE_CPU_SGEMM=auto measures each shape\n",
                source, kernels::kMatmulPrimitiveFlops);
    return;
  }
  if (std::optional<kernels::SgemmBackend> backend = kernels::forced_backend(policy)) {
    std::printf("# float32 GEMM: %s for every shape (%s; DPE_CPU_SGEMM=auto measures each shape)\n",
                std::string(kernels::sgemm_backend_name(*backend)).c_str(), source);
    return;
  }
  std::printf("# float32 GEMM per shape (DPE_CPU_SGEMM=auto: measured once per shape; OpenBLAS core %s):\n",
              openblas_get_corename());
  for (const kernels::SgemmChoice& c : kernels::sgemm_choices()) {
    std::printf("#   %s\n", kernels::describe(c).c_str());
  }
}

// Each data-parallel row against its framework's no-sync row of the same precision and devices: what its
// exchanges cost there (PyTorch: ddp-gloo against ddp-gloo-no-sync).
void print_exchange_costs(const std::vector<Row>& rows) {
  auto no_sync_bound = [](const Row& r) {
    return r.note.empty() && (r.framework == "dpe" ? r.mode == kNoSyncMode : r.config == kPytorchNoSyncConfig);
  };
  auto data_parallel = [](const Row& r) {
    if (!r.note.empty()) return false;
    return r.framework == "dpe" ? r.mode != "single" && r.mode != "single-all" && r.mode != kNoSyncMode
                                : r.config == "ddp-gloo";
  };
  for (const Row& bound : rows) {
    if (!no_sync_bound(bound)) continue;
    std::string shares;
    for (const Row& r : rows) {
      if (data_parallel(r) && r.framework == bound.framework && r.precision == bound.precision &&
          r.devices == bound.devices) {
        shares += (shares.empty() ? "" : ", ") + r.config + " " +
                  std::to_string(std::llround(100 * r.samples_per_s / bound.samples_per_s)) + "%";
      }
    }
    if (!shares.empty()) {
      std::printf("# %s %s exchanges nothing, the most data parallelism gets from these devices: %s of it\n",
                  bound.framework.c_str(), bound.config.c_str(), shares.c_str());
    }
  }
}

void print_table(const BenchArgs& args, const std::vector<Row>& rows) {
  std::printf("\n# dpe bench: %s, global batch %lld, %lld timed steps after %lld warm-up, ms per step and phase%s\n",
              args.model.c_str(), static_cast<long long>(args.batch_size), static_cast<long long>(args.steps),
              static_cast<long long>(args.warmup),
              args.repeat > 1 ? (", the median of " + std::to_string(args.repeat) + " rounds").c_str() : "");
  std::printf("%-8s %-16s %3s %10s %7s %8s | %7s %7s %7s %7s %7s %7s %7s %7s | %8s | %s\n", "impl", "config", "dev",
              "samples/s", "scaling", "step", "scatter", "bcast", "fwd", "gather", "loss", "bwd", "reduce", "optim",
              "MB moved", "peak MB per device");
  for (const Row& r : rows) {
    if (!r.note.empty()) {
      std::printf("%-8s %-16s %3d %10s  (%s)\n", r.framework.c_str(), r.config.c_str(), r.devices, "-", r.note.c_str());
      continue;
    }
    std::string peak;
    for (const auto& [d, bytes] : r.peak) peak += d.str() + " " + mb(bytes) + "  ";
    const StepReport& p = r.phases;
    if (r.framework == "dpe") {
      char scaling[16] = "-";
      if (r.scaling) std::snprintf(scaling, sizeof scaling, "%.0f%%", *r.scaling * 100);
      std::printf("%-8s %-16s %3d %10.0f %7s %8.2f | %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f | %8s | %s\n",
                  r.framework.c_str(), r.config.c_str(), r.devices, r.samples_per_s, scaling, r.step_ms,
                  p.scatter_ms, p.broadcast_ms, p.forward_ms, p.gather_ms, p.loss_ms, p.backward_ms, p.reduce_ms,
                  p.optimizer_ms, mb(p.scatter.bytes + p.broadcast.bytes + p.gather.bytes + p.reduce.bytes).c_str(),
                  peak.c_str());
    } else {
      std::printf("%-8s %-16s %3d %10.0f %7s %8.2f |\n", r.framework.c_str(), r.config.c_str(), r.devices,
                  r.samples_per_s, "", r.step_ms);
    }
  }
  print_exchange_costs(rows);
  // The CPU's FMA peak and GEMM choices describe CPU devices: a table of CUDA devices ends with its rows.
  const bool on_cpu = std::ranges::all_of(rows, [](const Row& r) {
    return std::ranges::all_of(r.peak, [](const auto& entry) { return entry.first.is_cpu(); });
  });
  if (!on_cpu) {
    std::printf("# cuDNN convolutions: %s\n", backends::cudnn::benchmark()
                    ? "the fastest measured algorithm per shape (--cudnn-benchmark)"
                    : "cuDNN's heuristics, deterministic algorithms first (--cudnn-benchmark measures them)");
    return;
  }
  const double flops = models::train_flops_per_sample(args.model);
  int64_t processes = 1;
  for (const Row& r : rows) processes = std::max(processes, r.processes);
  const PeakFlops peak = machine_peak(processes);
  std::printf("# CPU instruction set: %s\n", cpu_isa_description().c_str());
  std::printf("# FMA-peak limit: %.0f samples/s (%s / %.2f MFLOP per sample)\n", peak.gflops * 1e9 / flops,
              peak.source.c_str(), flops / 1e6);
  for (const Row& r : rows) {
    if (r.note.empty()) {
      // A 16-bit row's products run on other units (bfloat16 dot products, AMX tiles, tensor cores), which
      // the float32 FMA limit does not bound: its share says how much faster than that limit it went.
      std::printf("#   %s %s: %.0f%% of it%s\n", r.framework.c_str(), r.config.c_str(),
                  100 * r.samples_per_s * flops / (peak.gflops * 1e9),
                  r.precision == "fp32" ? "" : " (16-bit products: not bound by the float32 FMA limit)");
    }
  }
  print_sgemm_choices();
}

// --repeat: every round of every row.
void print_rounds(const std::vector<Row>& rows) {
  if (rows.front().rounds.empty()) return;
  std::printf("# %zu interleaved rounds: each row is its median round, its scaling the median of the rounds' own "
              "(against the same round's single row); every round:\n", rows.front().rounds.size());
  for (const Row& r : rows) {
    std::string samples, scalings;
    for (const Row::Round& round : r.rounds) {
      samples += (samples.empty() ? "" : ", ") + std::to_string(std::llround(round.samples_per_s));
      if (round.config != r.config) samples += " (" + round.config + ")";
      if (round.scaling) {
        scalings += (scalings.empty() ? "; scaling " : ", ") + std::to_string(std::llround(*round.scaling * 100)) + "%";
      }
    }
    std::printf("#   %s %s: %s samples/s%s\n", r.framework.c_str(), r.config.c_str(), samples.c_str(),
                scalings.c_str());
  }
}

// --profile: a row's backward by node kind, per step, the largest first.
void print_backward_profile(const Row& r, const std::vector<Device>& devices) {
  double total = 0;
  for (const autograd::NodeTime& n : r.backward_profile) total += n.ms;
  const double steps = static_cast<double>(r.profiled_steps);
  // Single rows ran on the first device; --dist mpi rows count every process's devices, but time this one's.
  const std::vector<Device> ran(devices.begin(), devices.begin() + std::min<size_t>(r.devices, devices.size()));
  std::printf("\n# %s backward by node on %s, per step (%lld profiled steps after the timed ones; %s)\n",
              r.config.c_str(), device_list_str(ran).c_str(), static_cast<long long>(r.profiled_steps),
              devices[0].is_cpu() ? "wall time" : "stream time between events around each node");
  std::printf("%-34s %10s %9s %6s\n", "node", "calls/step", "ms/step", "share");
  for (const autograd::NodeTime& n : r.backward_profile) {
    std::printf("%-34s %10.1f %9.3f %5.1f%%\n", n.name.c_str(), static_cast<double>(n.calls) / steps, n.ms / steps,
                total > 0 ? 100 * n.ms / total : 0.0);
  }
  std::printf("%-34s %10s %9.3f\n", "total", "", total / steps);
}

void write_outputs(const BenchArgs& args, const std::vector<Row>& rows) {
  if (!args.csv.empty()) {
    std::ofstream out(args.csv);
    DPE_CHECK(out.good(), "--csv ", args.csv, ": cannot open for writing");
    out << "framework,config,devices,samples_per_s,scaling,step_ms,scatter_ms,broadcast_ms,forward_ms,gather_ms,"
           "loss_ms,backward_ms,reduce_ms,optimizer_ms,bytes_moved,peak_bytes_max\n";
    for (const Row& r : rows) {
      int64_t peak = 0;
      for (const auto& [d, b] : r.peak) peak = std::max(peak, b);
      const StepReport& p = r.phases;
      out << r.framework << ',' << r.config << ',' << r.devices << ',' << r.samples_per_s << ',';
      if (r.scaling) out << *r.scaling;  // empty without a single row
      out << ',' << r.step_ms << ',' << p.scatter_ms << ',' << p.broadcast_ms << ',' << p.forward_ms << ','
          << p.gather_ms << ',' << p.loss_ms << ',' << p.backward_ms << ',' << p.reduce_ms << ',' << p.optimizer_ms << ','
          << p.scatter.bytes + p.broadcast.bytes + p.gather.bytes + p.reduce.bytes << ',' << peak << '\n';
    }
    out.close();
    DPE_CHECK(out.good(), "--csv ", args.csv, ": write failed");
  }
  if (!args.json.empty()) {
    // Written with nlohmann-json: strings (the PyTorch script's configs and notes among them) escaped. Numbers
    // keep the 6 significant digits the report always had (as_printed).
    using Json = JsonReport;
    Json report = {
        {"model", args.model}, {"batch_size", args.batch_size}, {"steps", args.steps}, {"repeat", args.repeat},
        {"rows", Json::array()}};
    const DisposeOnExit dispose_report(report);  // Note [A report's destructor allocates] (json_report.h)
    for (const Row& r : rows) {
      const StepReport& p = r.phases;
      Json row = {{"framework", r.framework},
                  {"config", r.config},
                  {"precision", r.precision},
                  {"devices", r.devices},
                  {"samples_per_s", as_printed("%g", r.samples_per_s)},
                  {"scaling", r.scaling ? Json(as_printed("%g", *r.scaling)) : Json(nullptr)},
                  {"step_ms", as_printed("%g", r.step_ms)},
                  {"phases_ms", {{"scatter", as_printed("%g", p.scatter_ms)},
                                 {"broadcast", as_printed("%g", p.broadcast_ms)},
                                 {"forward", as_printed("%g", p.forward_ms)},
                                 {"gather", as_printed("%g", p.gather_ms)},
                                 {"loss", as_printed("%g", p.loss_ms)},
                                 {"backward", as_printed("%g", p.backward_ms)},
                                 {"reduce", as_printed("%g", p.reduce_ms)},
                                 {"optimizer", as_printed("%g", p.optimizer_ms)}}},
                  {"peak_bytes", Json::object()}};
      if (!r.split_weights.empty()) {
        row["split_weights"] = Json::array();
        row["ms_per_sample"] = Json::array();
        for (size_t d = 0; d < r.split_weights.size(); ++d) {
          row["split_weights"].push_back(as_printed("%.4f", r.split_weights[d]));
          row["ms_per_sample"].push_back(as_printed("%.5f", r.ms_per_sample[d]));
        }
      }
      for (const auto& [device, bytes] : r.peak) row["peak_bytes"][device.str()] = bytes;
      if (!r.note.empty()) row["note"] = r.note;
      if (!r.rounds.empty()) {
        row["rounds"] = Json::array();
        for (const Row::Round& round : r.rounds) {
          row["rounds"].push_back({{"config", round.config},
                                   {"samples_per_s", as_printed("%g", round.samples_per_s)},
                                   {"scaling", round.scaling ? Json(as_printed("%g", *round.scaling)) : Json(nullptr)}});
        }
      }
      if (r.profiled_steps > 0) {
        row["backward_profile"] = Json::array();
        const double steps = static_cast<double>(r.profiled_steps);
        for (const autograd::NodeTime& n : r.backward_profile) {
          row["backward_profile"].push_back({{"node", n.name},
                                             {"calls_per_step", as_printed("%g", static_cast<double>(n.calls) / steps)},
                                             {"ms_per_step", as_printed("%g", n.ms / steps)}});
        }
      }
      report["rows"].push_back(std::move(row));
    }
    write_json_report("--json", args.json, report);
  }
  if (!args.png.empty()) {
    // gnuplot gets its script on stdin (the bars inline, as a datablock) and writes the PNG to its stdout;
    // we write that to --png ourselves. So the user's path never appears in gnuplot's language, where a quote
    // would end a string, a leading '|' would pipe into a command, and `...` would run one.
    std::ostringstream gp;
    gp << "$bars << EOD\n";
    double highest = 0;
    for (const Row& r : rows) {
      if (!r.note.empty()) continue;
      gp << '"' << gnuplot_label(r.framework + ' ' + r.config) << "\" " << r.samples_per_s << '\n';
      highest = std::max(highest, r.samples_per_s);
    }
    gp << "EOD\n"
       << "set terminal png size 900,500\n"
       << "set title \"dpe bench: " << gnuplot_label(args.model) << ", global batch " << args.batch_size << "\"\n"
       << "set ylabel 'samples/s'\nset style fill solid 0.6\nset boxwidth 0.6\nset grid ytics\n"
       << "set yrange [0:" << (highest > 0 ? highest * 1.15 : 1.0) << "]\n"  // room for the labels above the bars
       << "set xtics rotate by -30\nplot $bars using 0:2:xtic(1) with boxes notitle, $bars using 0:2:(sprintf('%.0f',$2)) "
          "with labels offset 0,1 notitle\n";
    ProcessResult result;
    try {
      result = run_process({"gnuplot"}, gp.str(), {.seconds = 60, .output_bytes = size_t{64} << 20});
    } catch (const Error& e) {
      // Only a gnuplot that is not there needs installing: a failure to start it (no file descriptors or
      // processes left) says what it was.
      const bool missing = find_program("gnuplot").empty();
      throw Error(std::string("--png: ") + e.what() + (missing ? "; install gnuplot with apt-get install gnuplot-nox" : ""));
    }
    DPE_CHECK(result.ok() && result.output.rfind("\x89PNG", 0) == 0, "--png: gnuplot failed (", describe_status(result),
              ")", result.ok() ? ": its output is not a PNG image" : "");
    std::ofstream png(args.png, std::ios::binary);
    png.write(result.output.data(), static_cast<std::streamsize>(result.output.size()));
    png.close();
    DPE_CHECK(png.good(), "--png ", args.png, ": cannot write the image");
  }
}

// Everything that can be refused before loading data or running anything; the output paths become the files
// to write (Note [One rule for every output file]).
std::vector<Device> check_before_work(BenchArgs& args) {
  std::vector<Device> devices = args.device_ids ? parse_device_option("--device-ids", *args.device_ids)
                                                : default_devices(args.cpu_devices, args.cpu_devices_given);
  check_device_ids("--device-ids", devices);
  models::check_model_name(args.model);
  if (args.dist != "none") {
    dist_backend(args.dist, devices);  // its checks
    for (const std::string& mode : args.modes) {
      DPE_CHECK(mode == "ddp" || mode == "dp" || mode == kNoSyncMode, "--modes ", join_commas(args.modes),
                " with --dist ", args.dist, ": ", mode,
                mode == "auto" ? " switches modes, which it cannot across processes" : " runs on one device",
                "; expected ddp, dp and/or ", kNoSyncMode);
    }
  } else if (std::ranges::any_of(args.modes, shards_per_replica)) {
    check_ddp_batch("--batch-size", args.batch_size, static_cast<int64_t>(devices.size()));
  }
  // The deterministic step sums every backward's shards whatever no_sync says (engine/deterministic_step.cc,
  // step 4), so its no-sync row would exchange as much as its ddp row.
  DPE_CHECK(!args.deterministic || std::ranges::find(args.modes, kNoSyncMode) == args.modes.end(), "--modes ",
            join_commas(args.modes), " with --deterministic: ", kNoSyncMode,
            " has no deterministic form (the deterministic step reduces every backward); drop one of them");
  for (const std::string& precision : args.precisions) check_precision(precision, devices);
  if (args.channels_last) check_channels_last(args.model);
  set_cudnn_benchmark(args.cudnn_benchmark, args.deterministic, devices);
  if (args.compare_pytorch) {
    for (const std::string& c : args.pytorch_configs) {
      DPE_CHECK(is_pytorch_config(c), "--pytorch-configs '", c, "': unknown configuration; expected single, "
                "single-Nt (N >= 1 threads), cuda, dp, ddp-gloo or ddp-gloo-no-sync (the ones "
                "tools/bench/pytorch_reference.py knows)");
    }
    DPE_CHECK(!args.pytorch_configs.empty(), "--pytorch-configs: expected at least one configuration");
    DPE_CHECK(args.pytorch_timeout <= kMaxHelperSeconds, "--pytorch-timeout ", args.pytorch_timeout,
              ": expected seconds in (0, ", static_cast<int64_t>(kMaxHelperSeconds), "]");
    check_input_file("--pytorch-script", pytorch_script_path(args));
    DPE_CHECK(access(args.pytorch_python.c_str(), X_OK) == 0, "--pytorch-python ", args.pytorch_python,
              ": not an executable file (the default is Debian's python3 with python3-torch: apt-get install "
              "python3-torch)");
  }
  peak_override();  // a bad DPE_PEAK_GFLOPS is refused now, not after the runs
  kernels::sgemm_policy_from_env();  // and a bad DPE_CPU_SGEMM
  // Note [One rule for every output file] (file_args.h): the files written are what the paths link to.
  if (!args.json.empty()) args.json = check_output_file("--json", args.json);
  if (!args.csv.empty()) args.csv = check_output_file("--csv", args.csv);
  check_distinct_files({{"--json", args.json}, {"--csv", args.csv}, {"--png", args.png}, {"--data-dir", args.data_dir}});
  if (!args.png.empty()) {
    args.png = check_output_file("--png", args.png);
    DPE_CHECK(!find_program("gnuplot").empty(), "--png ", args.png,
              ": needs gnuplot, which is not on PATH (apt-get install gnuplot-nox)");
  }
  return devices;
}

void run_bench(BenchArgs args) {
  std::vector<Device> devices = check_before_work(args);
  int64_t needed = args.batch_size * (args.steps + args.warmup);
  ModelData data = load_model_data(args.model, args.data_dir, needed, false);
  if (args.channels_last) data.train_inputs = data.train_inputs.contiguous(MemoryFormat::ChannelsLast);
  if (std::ranges::any_of(devices, [](const Device& d) { return d.is_cuda(); })) {
    // Batches for GPUs come from pinned memory, so that their copies are asynchronous DMA: as dpe train's
    // DataLoader(pin_memory) gives them, and as the PyTorch side pins its data (pytorch_reference.py).
    data.train_inputs = data.train_inputs.pin_memory();
    data.train_targets = data.train_targets.pin_memory();
  }
  DPE_CHECK(data.train_inputs.size(0) >= args.batch_size, "--batch-size ", args.batch_size, " is larger than the ",
            data.train_inputs.size(0), " training samples of ", args.model, "; expected at most ",
            data.train_inputs.size(0));
  // --repeat: the rounds interleaved (the file comment says why), every process of --dist mpi in the same order.
  std::vector<std::vector<Row>> rounds;
  for (int64_t round = 1; round <= args.repeat; ++round) {
    const std::string of_rounds =
        args.repeat > 1 ? ", round " + std::to_string(round) + " of " + std::to_string(args.repeat) : "";
    std::vector<Row> rows;
    for (const std::string& precision : args.precisions) {
      for (const std::string& mode : args.modes) {
        if (args.dist == "none") {
          std::fprintf(stderr, "bench: %s %s%s on %s%s...\n", args.model.c_str(), mode.c_str(),
                       precision == "fp32" ? "" : (" " + precision).c_str(), device_list_str(devices).c_str(),
                       of_rounds.c_str());
        }
        rows.push_back(bench_mode(args, mode, precision, devices, data));
      }
    }
    if (rows.front().reports) {  // --dist mpi: process 0 shows, writes and compares
      set_scaling(rows);
      if (args.compare_pytorch) {
        for (Row& r : bench_pytorch(args, data.train_inputs.size(0))) rows.push_back(std::move(r));
      }
    }
    rounds.push_back(std::move(rows));
  }
  if (!rounds.front().front().reports) return;
  const std::vector<Row> rows = median_rounds(std::move(rounds));
  print_table(args, rows);
  print_rounds(rows);
  // --split auto: what it settled on, per device.
  for (const Row& r : rows) {
    if (r.split_weights.empty()) continue;
    std::printf("# %s split auto:", r.config.c_str());
    for (size_t d = 0; d < r.split_weights.size(); ++d) {
      std::printf("  %s %.3f (%.4f ms/sample)", devices[d].str().c_str(), r.split_weights[d], r.ms_per_sample[d]);
    }
    std::printf("\n");
  }
  for (const Row& r : rows) {
    if (r.profiled_steps > 0) print_backward_profile(r, devices);
  }
  write_outputs(args, rows);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Single-device, DP and DDP mode on the same model, data and batch");
  cmd->add_option("--model", args->model, "model")->check(CLI::IsMember(models::kModelNames));
  CLI::Option* modes = add_name_list_option(*cmd, "--modes", args->modes,
                                            "modes to run; single-all: one device on every core; ddp-no-sync: ddp "
                                            "exchanging nothing (every backward in no_sync, every replica stepping on "
                                            "its own gradients), the most data parallelism gets from these devices "
                                            "(--dist mpi: dp, ddp, ddp-no-sync)",
                                            {"single", "single-all", "dp", "ddp", kNoSyncMode, "auto"});
  CLI::Option* deterministic = cmd->add_flag(
      "--deterministic", args->deterministic, "every mode in the deterministic mode (rows single-det, dp-det, ...): "
      "bitwise the same for any device count; compare with a run without it for its cost");
  add_int_option(*cmd, "--virtual-shards", args->virtual_shards,
                 "--deterministic: virtual shards per batch (default max(4, devices))", 1, 1 << 20)
      ->needs(deterministic);  // not by name: train_command.cc says why
  cmd->add_flag("--channels-last", args->channels_last, "the images in channels-last memory, PyTorch's "
                "memory_format=torch.channels_last: the CPU's convolutions, 2x2 max-pools, BatchNorm, activations and "
                "binary ops compute in it, no relayouts between layers (rows ddp-cl, ...)");
  cmd->add_flag("--cudnn-benchmark", args->cudnn_benchmark, kCudnnBenchmarkHelp);
  cmd->add_option("--reduce-dtype", args->reduce_dtype, "ddp rows: the dtype gradient buckets are all-reduced in "
                  "(rows ddp-rbf16, ...)")
      ->check(CLI::IsMember(kReduceDtypes));
  add_name_list_option(*cmd, "--precision", args->precisions, "precisions to run every mode in (rows ddp, ddp-bf16, "
                       "...): fp32; bf16 (autocast); fp16 (CUDA only, with a gradient scaler)", kPrecisions);
  cmd->add_option("--split", args->split, "dp and ddp's split of each batch over the devices: chunk (PyTorch's), "
                  "balanced, auto (chunks follow each device's measured speed)")
      ->check(CLI::IsMember(kSplitRules));
  add_dist_option(*cmd, args->dist, "ddp and dp mode over the devices of every process of an MPI launch; rows "
                  "dp-mpi and ddp-mpi for the whole group; process 0 prints, writes and runs --compare-pytorch");
  CLI::Option* device_ids = cmd->add_option("--device-ids", args->device_ids,
                  "devices, e.g. cpu:0,cpu:1 (default: every CUDA device, else --cpu-devices CPU devices)");
  CLI::Option* cpu_devices = add_int_option(*cmd, "--cpu-devices", args->cpu_devices,
                                            "CPU devices cpu:0 ... (default: 2 where there is no GPU)", 1, kMaxDevices);
  cpu_devices->excludes(device_ids);  // one or the other: a count beside a list would be ignored
  add_int_option(*cmd, "--batch-size", args->batch_size,
                 "global batch (at most the training samples; in ddp mode every device needs a sample of it)", 1,
                 int64_t{1} << 31);
  add_int_option(*cmd, "--steps", args->steps, "timed steps per mode", 1, 1000000);
  add_int_option(*cmd, "--warmup", args->warmup, "untimed steps before them", 0, 1000000);
  add_int_option(*cmd, "--repeat", args->repeat,
                 "rounds: every row (PyTorch's too) runs this many times, the rows interleaved round by round; each "
                 "row shows its median round and every round is listed (for noisy, shared machines)", 1, 1000);
  add_path_option(*cmd, "--data-dir", args->data_dir, "Fashion-MNIST directory, or the text file for tiny-llama");
  CLI::Option* compare = cmd->add_flag("--compare-pytorch", args->compare_pytorch,
                                       "also run tools/bench/pytorch_reference.py (Debian python3-torch)");
  add_name_list_option(*cmd, "--pytorch-configs", args->pytorch_configs,
                       "PyTorch configurations: single, single-Nt, cuda, dp, ddp-gloo, ddp-gloo-no-sync (with "
                       "--compare-pytorch)")
      ->needs(compare);
  add_path_option(*cmd, "--pytorch-python", args->pytorch_python,
                  "the python3 whose torch runs the PyTorch side (an executable path, run directly; default "
                  "Debian's /usr/bin/python3; with --compare-pytorch)")
      ->needs(compare);
  add_real_option(*cmd, "--pytorch-timeout", args->pytorch_timeout,
                  "seconds the PyTorch side may run before it is killed (with --compare-pytorch)", 0, true)
      ->needs(compare);
  add_path_option(*cmd, "--pytorch-script", args->pytorch_script,
                  "path of pytorch_reference.py (default: the repository's; with --compare-pytorch)")
      ->needs(compare);
  cmd->add_flag("--profile", args->profile, "after each mode's timed steps, as many again with every backward node "
               "timed: a table per mode of node kinds by time per step (--json: backward_profile)");
  add_path_option(*cmd, "--json", args->json, "write the rows as JSON (checked at start-up)");
  add_path_option(*cmd, "--csv", args->csv, "write the rows as CSV (checked at start-up)");
  add_path_option(*cmd, "--png", args->png, "draw samples/s per configuration (gnuplot; checked at start-up)");
  cmd->callback([args, modes, cpu_devices] {
    args->cpu_devices_given = cpu_devices->count() > 0;
    if (args->dist != "none" && modes->count() == 0) args->modes = {"dp", "ddp"};
    run_bench(*args);
  });
}

}  // namespace dpe::tool
