// dpe bench's rows of dpe (bench.h): each mode run on the engine as dpe train runs it, its timed steps
// measured, and the rounds of --repeat reduced to their medians.
#include <omp.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <memory>
#include <thread>

#include "core/allocator.h"
#include "core/cpu_cores.h"
#include "engine/worker_pool.h"
#include "models/models.h"
#include "tools/dpe/bench.h"
#include "tools/dpe/dist_option.h"

namespace dpe::tool::bench {

namespace {

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

// The lower middle of `values` (the median for an odd count).
template <typename T, typename Key>
T lower_median(std::vector<T> values, Key key) {
  std::ranges::stable_sort(values, {}, key);
  return values[(values.size() - 1) / 2];
}

}  // namespace

int64_t tokens_per_sample(const BenchArgs& args) {
  return args.llama ? (args.seq_len > 0 ? args.seq_len : args.llama->max_seq_len) : 1;
}

double flops_per_sample(const BenchArgs& args) {
  if (!args.llama) return models::train_flops_per_sample(args.model);
  const int64_t seq_len = tokens_per_sample(args);
  return nn::llama_size(*args.llama, seq_len).train_flops_per_token * static_cast<double>(seq_len);
}

ModelData random_tokens(const BenchArgs& args, int64_t rows) {
  const int64_t seq_len = tokens_per_sample(args);
  std::mt19937_64 rng(0);
  std::vector<int64_t> tokens(static_cast<size_t>(rows * (seq_len + 1)));
  for (int64_t& t : tokens) t = static_cast<int64_t>(rng() % static_cast<uint64_t>(args.llama->vocab_size));
  const Tensor windows = Tensor::from_vector(tokens, {rows, seq_len + 1}, TensorOptions(DType::Int64));
  return {.train_inputs = windows.narrow(1, 0, seq_len).contiguous(),
          .train_targets = windows.narrow(1, 1, seq_len).contiguous()};
}

OptimizerOptions bench_optimizer(const BenchArgs& args) {
  const std::string name = !args.optimizer.empty() ? args.optimizer : args.llama ? "adamw" : "sgd";
  const bool adam = name != "sgd";
  return {.name = name, .lr = adam ? 6e-4 : 0.01, .weight_decay = name == "adamw" ? 0.1 : 0.0,
          .decay_matrices_only = name == "adamw"};
}

Row bench_mode(const BenchArgs& args, const std::string& mode, const std::string& precision,
               const std::vector<Device>& devices, const ModelData& data) {
  Row row;
  row.config = row.mode = mode;
  row.precision = precision;
  const bool no_sync = mode == kNoSyncMode;
  const int zero_stage = mode == "ddp-zero1" ? 1 : mode == "ddp-zero2" ? 2 : 0;
  const std::string engine_mode = mode == "single-all" ? "single" : no_sync || zero_stage > 0 ? "ddp" : mode;
  const std::optional<CollectiveBackend> dist = dist_backend(args.dist, devices);
  const bool across_processes = dist.has_value();
  // Declared before the engine, so destroyed after it: what the allocators cached for this row goes back to the
  // system, for the next row and for PyTorch's side (another process): a 124M Llama's replicas cache gigabytes.
  struct ReleaseCaches {
    const std::vector<Device>& devices;
    ~ReleaseCaches() {
      for (const Device& d : devices) {
        try {
          empty_cache(d);
        } catch (...) {  // a cache that cannot be released costs memory, not the row
        }
      }
    }
  } release_caches{devices};
  std::unique_ptr<DataParallel> dp = make_engine(
      {.model = args.model, .mode = engine_mode, .devices = devices, .split = parse_split_rule(args.split),
       .deterministic = args.deterministic, .virtual_shards = args.virtual_shards,
       .precision = precision, .reduce_dtype = needs_ddp_shards(mode) ? args.reduce_dtype : "fp32", .dist = dist,
       .zero_stage = zero_stage, .activation_checkpointing = args.activation_checkpointing, .seed = 1,
       .llama = args.llama},
      bench_optimizer(args));
  // --dist mpi: every process takes its slice of each global batch (training.h, as dpe train does); the row
  // is the whole group's: its devices over every process, the global batch's samples/s.
  const ProcessSlice slice = process_slice(*dp, across_processes, args.batch_size);
  row.devices = static_cast<int>(slice.devices);
  row.reports = slice.reports();
  row.processes = slice.count;
  if (across_processes) row.config = mode + "-" + args.dist;  // ddp-mpi, ddp-mpi-nccl
  if (args.deterministic) row.config += "-det";
  if (args.channels_last) row.config += "-cl";
  if (args.activation_checkpointing) row.config += "-ac";
  const std::string precision_suffix = (precision == "fp32" ? "" : "-" + precision) +
                                       (needs_ddp_shards(mode) && args.reduce_dtype != "fp32" ? "-r" + args.reduce_dtype : "");
  row.config += precision_suffix;
  LossFn loss = args.llama ? language_model_loss() : models::model_loss(args.model);
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
      const MemoryStats stats = memory_stats(d);
      const int64_t data_here = d == data.train_inputs.device() ? data_bytes : 0;
      row.peak.emplace_back(d, stats.peak_allocated_bytes - data_here);
      row.peak_split.push_back(stats.peak_by_kind);
      row.peak_split.back()[static_cast<size_t>(MemoryKind::Activations)] -= data_here;
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

void set_scaling(std::vector<Row>& rows) {
  for (Row& r : rows) {
    for (const Row& single : rows) {
      if (single.precision == r.precision && single.mode == "single") {
        r.scaling = r.samples_per_s / (single.samples_per_s * r.devices);
      }
    }
  }
}

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

}  // namespace dpe::tool::bench
