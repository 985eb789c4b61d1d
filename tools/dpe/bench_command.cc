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
//
// The command: its options, the checks before any work, the rounds. Its parts are in bench.h.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "models/models.h"
#include "core/peak_flops.h"
#include "tools/dpe/bench.h"
#include "tools/dpe/cli_util.h"
#include "tools/dpe/commands.h"
#include "tools/dpe/dist_option.h"
#include "tools/dpe/file_args.h"
#include "tools/dpe/subprocess.h"
#include "tools/dpe/train_llm.h"

namespace dpe::tool {

namespace {

using namespace bench;

// Everything that can be refused before loading data or running anything; the output paths become the files
// to write (Note [One rule for every output file]).
std::vector<Device> check_before_work(BenchArgs& args) {
  std::vector<Device> devices = args.device_ids ? parse_device_option("--device-ids", *args.device_ids)
                                                : default_devices(args.cpu_devices, args.cpu_devices_given);
  check_device_ids("--device-ids", devices);
  if (args.model == "llama") {
    nn::LlamaConfig config = nn::llama_preset(args.llama_preset);
    apply_overrides(config, args.dim, args.layers, args.heads, args.kv_heads);
    DPE_CHECK(args.seq_len <= config.max_seq_len, "--seq-len ", args.seq_len, " is longer than the ",
              args.llama_preset, " preset's ", config.max_seq_len, " positions");
    args.llama = config;
    DPE_CHECK(!args.compare_pytorch || std::ranges::all_of(args.pytorch_configs, [](const std::string& c) {
                return c != "dp";
              }), "--compare-pytorch with --model llama: PyTorch's dp configuration is not in the llama comparison");
  } else {
    models::check_model_name(args.model);
  }
  if (args.dist != "none") {
    dist_backend(args.dist, devices);  // its checks
    for (const std::string& mode : args.modes) {
      DPE_CHECK(mode != "auto" && mode != "single" && mode != "single-all", "--modes ", join_commas(args.modes),
                " with --dist ", args.dist, ": ", mode,
                mode == "auto" ? " switches modes, which it cannot across processes" : " runs on one device",
                "; expected ddp, dp, ddp-zero1, ddp-zero2 and/or ", kNoSyncMode);
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
      DPE_CHECK(is_pytorch_config(c), "--pytorch-configs '", c, "': unknown configuration; expected ",
                pytorch_config_list(" (N >= 1 threads)", " or "), " (the ones tools/bench/pytorch_reference.py knows)");
    }
    DPE_CHECK(!args.pytorch_configs.empty(), "--pytorch-configs: expected at least one configuration");
    DPE_CHECK(args.pytorch_timeout <= kMaxHelperSeconds, "--pytorch-timeout ", args.pytorch_timeout,
              ": expected seconds in (0, ", static_cast<int64_t>(kMaxHelperSeconds), "]");
    check_input_file("--pytorch-script", pytorch_script_path(args));
    DPE_CHECK(access(args.pytorch_python.c_str(), X_OK) == 0, "--pytorch-python ", args.pytorch_python,
              ": not an executable file (the default is Debian's python3 with python3-torch: apt-get install "
              "python3-torch)");
  }
  peak_gflops_override();  // a bad DPE_PEAK_GFLOPS is refused now, not after the runs
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
  ModelData data = args.llama ? random_tokens(args, needed) : load_model_data(args.model, args.data_dir, needed, false);
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
  print_split_weights(rows, devices);
  for (const Row& r : rows) {
    if (r.profiled_steps > 0) print_backward_profile(r, devices);
  }
  write_outputs(args, rows);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Single-device, DP and DDP mode on the same model, data and batch");
  cmd->add_option("--model", args->model, "model: mlp, cnn, tiny-llama, or llama (a preset, on random tokens: "
                  "tokens/s and MFU)")->check(CLI::IsMember(kTrainModels));
  cmd->add_option("--llama-preset", args->llama_preset, "--model llama: the preset (layers/llama.h)")
      ->check(CLI::IsMember(nn::kLlamaPresetNames));
  add_int_option(*cmd, "--seq-len", args->seq_len, "--model llama: tokens per sample (default: the preset's longest)",
                 1, int64_t{1} << 20);
  add_int_option(*cmd, "--dim", args->dim, "--model llama: model width (default: the preset's)", 1, 1 << 20);
  add_int_option(*cmd, "--layers", args->layers, "--model llama: blocks (default: the preset's)", 1, 4096);
  add_int_option(*cmd, "--heads", args->heads, "--model llama: query heads (default: the preset's)", 1, 4096);
  add_int_option(*cmd, "--kv-heads", args->kv_heads, "--model llama: key/value heads (default: the preset's)", 1, 4096);
  CLI::Option* modes = add_name_list_option(*cmd, "--modes", args->modes,
                                            "modes to run; single-all: one device on every core; ddp-zero1, ddp-zero2: "
                                            "ddp with ZeRO stage 1 or 2 (optimizer state, and gradients, sharded); "
                                            "ddp-no-sync: ddp "
                                            "exchanging nothing (every backward in no_sync, every replica stepping on "
                                            "its own gradients), the most data parallelism gets from these devices "
                                            "(--dist mpi: dp, ddp, ddp-no-sync)",
                                            {"single", "single-all", "dp", "ddp", kNoSyncMode, "auto", "ddp-zero1",
                                             "ddp-zero2"});
  cmd->add_flag("--activation-checkpointing", args->activation_checkpointing,
                std::string(kActivationCheckpointingHelp) + " (rows ddp-ac, ...)");
  cmd->add_option("--optimizer", args->optimizer, "sgd (momentum 0.9), adam or adamw (decay on matrices); default "
                  "adamw for llama, sgd otherwise")
      ->check(CLI::IsMember(std::vector<std::string>{"sgd", "adam", "adamw"}));
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
                       "PyTorch configurations: " + pytorch_config_list("", ", ") + " (with --compare-pytorch)")
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
