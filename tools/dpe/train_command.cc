// dpe train: trains a built-in model in single, DP or DDP mode, with a progress line, test accuracy per
// epoch, checkpoints every N epochs (replica 0 only, atomic) and resume.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/data_loader.h"
#include "data/fashion_mnist.h"
#include "data/text_corpus.h"
#include "io/checkpoint.h"
#include "models/models.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "tools/dpe/cli_util.h"
#include "tools/dpe/fault_injection.h"
#include "tools/dpe/file_args.h"
#include "tools/dpe/input_identity.h"
#include "tools/dpe/commands.h"
#include "tools/dpe/dist_option.h"
#include "tools/dpe/json_report.h"
#include "tools/dpe/progress.h"
#include "tools/dpe/run_configuration.h"
#include "tools/dpe/train_llm.h"
#include "tools/dpe/training.h"

namespace dpe::tool {

namespace {

struct TrainArgs {
  EngineOptions engine;
  OptimizerOptions optimizer;
  std::optional<std::string> device_ids, output_device;
  std::string data_dir, json;
  std::string checkpoint = "dpe_checkpoint.safetensors";
  bool checkpoint_given = false;  // --checkpoint on the command line (it needs --save-every)
  std::string schedule = "cosine";
  int64_t batch_size = 128, epochs = 10, limit = -1, save_every = 0;
  bool drop_last = false;
  bool channels_last = false;  // every batch (and the test split) in channels-last memory
  bool cudnn_benchmark = false;  // cuDNN's convolution algorithms measured (core/backends.h)
  int cpu_devices = 2;
  bool cpu_devices_given = false;  // --cpu-devices given: CPU devices even where there is a GPU
  std::string dist = "none";
  std::string split = "chunk";
  std::string on_device_failure = "fail";
  InjectedFaults faults;  // tests only (fault_injection.h)
  LlmOptions llm;         // --model llama (train_llm.h)
  LlmData llm_data;       // its data directory, read by prepare_llm
  RunConfiguration configuration;          // Note [A run's configuration] (run_configuration.h): across resumes
  RunConfiguration process_configuration;  // and across the processes of one launch
  std::vector<std::string> overrides;   // --override: options a resumed run may change
  std::vector<std::string> llm_options_given, epoch_options_given;  // to refuse those of the other kind
  bool optimizer_given = false, lr_given = false, weight_decay_given = false;
};

// --model llama trains by steps on token shards (train_llm.h): the epoch loop's options do not apply to it,
// nor its options to the other models. The tutorials' optimizer unless the command line names another.
void prepare_llm(TrainArgs& args) {
  const bool llama = args.engine.model == "llama";
  const std::vector<std::string>& wrong = llama ? args.epoch_options_given : args.llm_options_given;
  DPE_CHECK(wrong.empty(), wrong.empty() ? "" : wrong[0], llama ? " applies to the epoch-based models (mlp, cnn, "
            "tiny-llama); --model llama trains by steps (--max-steps)" : " applies to --model llama only");
  if (!llama) return;
  args.llm.data = args.data_dir;
  args.llm.save_every = args.save_every;
  check_llm_options(args.llm);  // before anything reads the data directory
  args.llm_data = open_llm_data(args.llm);
  args.engine.llama = llama_config(args.llm, args.llm_data);
  if (!args.optimizer_given) args.optimizer.name = "adamw";
  if (!args.lr_given) args.optimizer.lr = 6e-4;
  if (!args.weight_decay_given) args.optimizer.weight_decay = 0.1;
  args.optimizer.decay_matrices_only = true;
}

// Everything that can be refused without loading data or building the engine, in the order a user would
// fix it: devices, the mode's constraints, output paths, the checkpoint to resume.
void check_before_work(TrainArgs& args, io::TrainingState* resumed) {
  args.engine.devices = args.device_ids ? parse_device_option("--device-ids", *args.device_ids)
                                        : default_devices(args.cpu_devices, args.cpu_devices_given);
  check_device_ids("--device-ids", args.engine.devices);
  if (args.output_device) {
    DPE_CHECK(args.engine.mode == "dp", "--output-device ", *args.output_device, " is used only in dp mode (--mode ",
              args.engine.mode, " has no output device)");
    args.engine.output_device = Device::parse(*args.output_device);
    check_device_ids("--output-device", {*args.engine.output_device});
  }
  args.engine.dist = dist_backend(args.dist, args.engine.devices);
  args.engine.split = parse_split_rule(args.split);
  args.engine.on_device_failure = parse_device_failure_policy(args.on_device_failure);
  check_engine_options(args.engine);
  if (args.channels_last) check_channels_last(args.engine.model);
  set_cudnn_benchmark(args.cudnn_benchmark, args.engine.deterministic, args.engine.devices);
  if (needs_ddp_shards(args.engine.mode) && !args.engine.dist) {  // across processes: in run_train
    check_ddp_batch("--batch-size", args.batch_size, static_cast<int64_t>(args.engine.devices.size()));
  }
  // Note [One rule for every output file] (file_args.h): the files written are what the paths link to.
  if (!args.json.empty()) args.json = check_output_file("--json", args.json);
  DPE_CHECK(!args.checkpoint_given || args.save_every > 0, "--checkpoint ", args.checkpoint,
            " is written only with --save-every N (N >= 1); add it, or drop --checkpoint");
  if (args.save_every > 0) args.checkpoint = check_output_file("--checkpoint", args.checkpoint, kCheckpointTemporarySuffix);
  const std::string checkpoint = args.save_every > 0 ? args.checkpoint : "";
  // --resume and --checkpoint may be one file: continue, and keep saving there.
  check_distinct_files({{"--json", args.json}, {"--checkpoint", checkpoint}, {"--data-dir", args.data_dir}});
  check_distinct_files({{"--json", args.json}, {"--resume", args.engine.resume}});
  if (!args.engine.resume.empty()) {
    *resumed = read_checkpoint_state(args.engine, args.optimizer);
    DPE_CHECK(resumed->epoch >= 0 && resumed->step >= 0, "--resume ", args.engine.resume,
              ": the checkpoint says training.epoch ", resumed->epoch, ", training.step ", resumed->step,
              "; expected counts >= 0 (a damaged or foreign checkpoint)");
  }
}

std::chrono::milliseconds collectives_timeout(const TrainArgs& args) {
  return std::chrono::milliseconds(std::llround(std::clamp(args.engine.timeout_s, 1e-3, 1e7) * 1000));
}

// First of all, before any data is read or model built: the options every process of a launch must share,
// then a resumed run's options against its checkpoint's (Note [A run's configuration]). A changed option is
// named before any error it would cause further on (another model's options, another data directory).
void check_configuration(const TrainArgs& args) {
  check_not_alone_in_a_launch(args.dist, "train");
  if (args.dist != "none") {
    check_same_across_processes(args.process_configuration, "the processes were launched with different options",
                                "every process must get the same training options; those that may differ: " +
                                    option_list(kMayDifferPerProcess),
                                collectives_timeout(args));
  }
  if (args.engine.resume.empty()) return;
  check_input_file("--resume", args.engine.resume);
  const io::TrainingState saved = io::read_training_state(args.engine.resume);
  for (const std::string& line :
       compare_configuration(args.configuration, saved.metadata, args.overrides, args.engine.resume)) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

// Under --dist, what the processes read (Note [What the processes read must be the same]): the files of the
// data directory the model reads and the checkpoint resumed, compared by content, whatever their paths.
void check_same_inputs(const TrainArgs& args, const io::TrainingState& resumed) {
  RunConfiguration inputs;
  auto add = [&](const std::string& path) {
    inputs["--data-dir file " + path.substr(path.find_last_of('/') + 1)] = file_identity(path);
  };
  const std::string& model = args.engine.model;
  if (model == "llama") {
    add(args.llm.data + "/tokenizer.model");
    for (const std::string& shard : args.llm_data.train_shards) add(shard);
    for (const std::string& shard : args.llm_data.val_shards) add(shard);
  } else if (model == "tiny-llama") {
    add(args.data_dir.empty() ? data::kFortunesPath : args.data_dir);
  } else {
    const std::string dir = args.data_dir.empty() ? data::kFashionMnistDir : args.data_dir;
    for (const char* name : data::kFashionMnistFiles) add(dir + "/" + name);
  }
  if (!args.engine.resume.empty()) {
    inputs["--resume"] = "step " + std::to_string(resumed.step) + ", " + file_identity(args.engine.resume);
  }
  check_same_across_processes(inputs, "the processes read different inputs",
                              "each process may read its own copy of the data and of the checkpoint it resumes; the "
                              "copies must hold the same bytes", collectives_timeout(args));
}

// One line of the --json report's "epochs", kept as plain numbers while training runs.
struct EpochRecord {
  int64_t epoch = 0;
  double train_loss = 0, test_accuracy = 0, loss_scale = 0, samples_per_s = 0, seconds = 0;
  int64_t skipped_steps = 0;
};

// The --json report, written with nlohmann-json: strings escaped, keys in this order. Built here, at the end,
// key by key (nlohmann's initializer lists leave temporaries whose destructors allocate) and disposed of
// before it goes: Note [A report's destructor allocates] (json_report.h).
void write_json(const TrainArgs& args, const DataParallel& dp, int64_t processes, double accuracy,
                const std::vector<EpochRecord>& epochs, const std::vector<std::string>& recovered = {}) {
  JsonReport report = JsonReport::object();
  const DisposeOnExit dispose_report(report);
  report["model"] = args.engine.model;
  report["mode"] = args.engine.mode;
  report["mode_used"] = mode_name(dp.mode());
  report["devices"] = device_list_str(dp.device_ids());
  report["processes"] = processes;
  report["batch_size"] = args.batch_size;
  report["precision"] = args.engine.precision;
  report["reduce_dtype"] = args.engine.reduce_dtype;
  report["zero"] = args.engine.zero_stage;
  report["final_test_accuracy"] = as_printed("%g", accuracy);
  JsonReport& lines = report["epochs"] = JsonReport::array();
  for (const EpochRecord& e : epochs) {
    JsonReport& line = lines.emplace_back(JsonReport::object());
    line["epoch"] = e.epoch;
    line["train_loss"] = as_printed("%.6f", e.train_loss);
    line["test_accuracy"] = as_printed("%.6f", e.test_accuracy);
    line["skipped_steps"] = e.skipped_steps;
    line["loss_scale"] = as_printed("%g", e.loss_scale);
    line["samples_per_s"] = as_printed("%.2f", e.samples_per_s);
    line["seconds"] = as_printed("%.3f", e.seconds);
  }
  if (!recovered.empty()) {  // --on-device-failure
    JsonReport& failures = report["recovered_failures"] = JsonReport::array();
    for (const std::string& r : recovered) failures.emplace_back(r);
  }
  if (const auto& choice = dp.last_step().auto_mode; choice && choice->chosen) {
    JsonReport& chosen = report["auto"] = JsonReport::object();
    chosen["chosen"] = mode_name(*choice->chosen);
    chosen["dp_step_ms"] = as_printed("%.3f", choice->dp_step_ms);
    chosen["ddp_step_ms"] = as_printed("%.3f", choice->ddp_step_ms);
  }
  write_json_report("--json", args.json, report);
}

void run_train(TrainArgs args) {
  check_configuration(args);
  io::TrainingState resumed;
  prepare_llm(args);
  check_before_work(args, &resumed);
  if (args.engine.dist) check_same_inputs(args, resumed);
  if (args.engine.model == "llama") {
    return run_train_llm(args.engine, args.optimizer, args.llm, args.llm_data,
                         {.batch_size = args.batch_size, .checkpoint = args.save_every > 0 ? args.checkpoint : "",
                          .json = args.json, .configuration = args.configuration},
                         resumed);
  }
  ModelData data = load_model_data(args.engine.model, args.data_dir, args.limit);
  if (args.channels_last) data.test_inputs = data.test_inputs.contiguous(MemoryFormat::ChannelsLast);
  const int64_t samples_per_epoch = data.train_inputs.size(0);
  DPE_CHECK(!args.drop_last || samples_per_epoch >= args.batch_size, "--drop-last with --batch-size ",
            args.batch_size, " and ", samples_per_epoch, " training samples: every batch would be dropped (0 steps "
            "per epoch); use a smaller --batch-size or no --drop-last");
  int64_t first_epoch = 0;
  std::unique_ptr<DataParallel> dp = make_engine(args.engine, args.optimizer, &first_epoch);
  DPE_INTERNAL_ASSERT(first_epoch == resumed.epoch, "the checkpoint's epoch changed between two reads");
  LossFn loss_fn = models::model_loss(args.engine.model);
  int64_t step_in_run = 0;  // what fault injection counts (fault_injection.h)
  loss_fn = with_injected_faults(std::move(loss_fn), args.faults, step_in_run);
  // --dist mpi: this process's slice of every global batch (training.h); process 0 prints, evaluates, and
  // writes checkpoints and --json.
  const ProcessSlice slice = process_slice(*dp, args.engine.dist.has_value(), args.batch_size);
  const bool prints = slice.reports();
  // Batches for GPUs are gathered into pinned memory, so that the scatter's copies are asynchronous DMA.
  const bool to_cuda = std::ranges::any_of(dp->device_ids(), [](const Device& d) { return d.is_cuda(); });
  // The short last batch of an epoch (without --drop-last) trains as it is in one process: a DDP device
  // without a sample takes part with zeros (the engine). Across processes every process takes an equal slice,
  // and SyncBatchNorm needs a sample on every replica: there it is padded to a multiple of the parts (samples
  // from the start of the epoch's order, as DistributedSampler pads; data/data_loader.h).
  const int64_t replicas = slice.parts;
  const bool pad = !args.drop_last && (args.engine.dist.has_value() || args.engine.sync_bn);
  data::DataLoader loader(data.train_inputs, data.train_targets,
                          {.batch_size = args.batch_size, .seed = args.engine.seed, .drop_last = args.drop_last,
                           .pad_last_to_multiple = pad ? replicas : 0, .prefetch = 2, .pin_memory = to_cuda});
  const int64_t remainder = samples_per_epoch % args.batch_size;
  std::string last_batch;
  if (remainder != 0 && args.drop_last) {
    last_batch = ", last " + std::to_string(remainder) + " dropped (--drop-last)";
  } else if (remainder != 0 && loader.last_batch_size() != remainder) {
    last_batch = ", last batch of " + std::to_string(remainder) + " padded to " +
                 std::to_string(loader.last_batch_size()) + " for " + std::to_string(replicas) +
                 (needs_ddp_shards(args.engine.mode) ? " DDP devices" : " processes");
  } else if (remainder != 0 && needs_ddp_shards(args.engine.mode) && remainder < replicas) {
    last_batch = ", last batch of " + std::to_string(remainder) + " unpadded (DDP devices without a sample take part "
                 "with zeros)";
  }
  const std::string where = device_list_str(dp->device_ids()) +
                            (slice.count > 1 ? " in each of " + std::to_string(slice.count) + " processes" : "");
  if (prints) {
    std::printf("dpe train: %s, mode %s on %s, global batch %lld, %lld training samples%s, %lld test samples%s%s\n",
                args.engine.model.c_str(), args.engine.mode.c_str(), where.c_str(),
                static_cast<long long>(args.batch_size), static_cast<long long>(samples_per_epoch), last_batch.c_str(),
                static_cast<long long>(data.test_inputs.size(0)),
                first_epoch > 0 ? (" (resumed after epoch " + std::to_string(first_epoch) + ")").c_str() : "",
                args.engine.precision == "fp32" ? "" : (", precision " + args.engine.precision).c_str());
  }
  std::fflush(stdout);  // before the progress lines on stderr
  // The test split is evaluated in the precision trained in.
  auto evaluate = [&] {
    PrecisionScope precision(args.engine.precision, dp->device_ids());
    return test_accuracy(*dp, args.engine.model, data.test_inputs, data.test_targets);
  };
  if (first_epoch >= args.epochs) {
    // A finished run (or --epochs lower than the checkpoint's): report the loaded model, train nothing.
    if (!prints) return;
    double accuracy = evaluate();
    std::printf("nothing left to train: %s is after epoch %lld and --epochs is %lld; the loaded model was evaluated\n",
                args.engine.resume.c_str(), static_cast<long long>(first_epoch), static_cast<long long>(args.epochs));
    std::printf("final test accuracy %.4f\n", accuracy);
    if (!args.json.empty()) write_json(args, *dp, slice.count, accuracy, {});
    return;
  }
  // One scheduler per optimizer (DDP: per replica, so every replica keeps the same learning rate), stepped
  // after every optimizer step; a resumed run jumps to where the checkpoint stopped (set_last_epoch: O(1),
  // bit-identical to stepping there, whatever the checkpoint's epoch).
  // --mode auto: a switch replaces the optimizers of replicas 1.. (made afresh, loaded with the master's
  // state), so the schedulers are made again, at the step reached; so does a dropped device.
  std::vector<std::unique_ptr<optim::LRScheduler>> schedulers;
  auto make_schedulers = [&](int64_t steps_done) {
    schedulers.clear();
    if (args.schedule != "cosine") return;
    for (size_t r = 0; r < dp->num_optimizers(); ++r) {
      // A resumed optimizer holds the decayed rate; the schedule starts from --lr.
      for (optim::ParamGroup& group : dp->optimizer(r).param_groups()) group.lr = args.optimizer.lr;
      schedulers.push_back(std::make_unique<optim::CosineWithWarmup>(dp->optimizer(r), 0, args.epochs * loader.num_batches()));
      if (steps_done > 0) schedulers.back()->set_last_epoch(steps_done);
    }
  };
  make_schedulers(first_epoch * loader.num_batches());
  bool auto_reported = false;
  std::vector<std::string> recovered_failures;  // --on-device-failure: what was recovered from
  std::vector<EpochRecord> epoch_records;
  double accuracy = 0;
  for (int64_t epoch = first_epoch; epoch < args.epochs; ++epoch) {
    loader.begin_epoch(epoch);
    std::optional<Progress> progress;
    if (prints) progress.emplace("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(args.epochs), loader.num_batches());
    auto start = std::chrono::steady_clock::now();
    double loss_sum = 0;
    int64_t samples = 0, steps = 0, skipped = 0;  // skipped: steps the gradient scaler skipped (inf/NaN)
    while (std::optional<data::Batch> batch = loader.next()) {
      const ParallelMode mode_before = dp->mode();
      double loss = 0;
      {
        // --precision: autocast for the step; the guard's end empties the cast cache (core/amp/autocast.h).
        PrecisionScope precision(args.engine.precision, dp->device_ids());
        const Tensor inputs = args.channels_last ? batch->inputs.contiguous(MemoryFormat::ChannelsLast) : batch->inputs;
        loss = dp->train_step(slice.of(inputs), slice.of(batch->targets), loss_fn);
      }
      ++step_in_run;
      skipped += dp->last_step().skipped_step ? 1 : 0;
      // A dropped device (--on-device-failure drop_device) took its replica's optimizer with it: the schedulers
      // of the survivors are made again too (stepping the old ones read the freed optimizer).
      if (dp->mode() != mode_before || !dp->last_step().recovered_failures.empty()) {
        make_schedulers(epoch * loader.num_batches() + steps);
      }
      for (auto& scheduler : schedulers) scheduler->step();
      for (const std::string& recovered : dp->last_step().recovered_failures) {
        std::fprintf(stderr, "warning: %s\n", recovered.c_str());
        recovered_failures.push_back(recovered);
      }
      if (const std::string chosen = auto_mode_summary(dp->last_step()); !chosen.empty() && !auto_reported && prints) {
        std::fprintf(stderr, "%s\n", chosen.c_str());
        auto_reported = true;
      }
      loss_sum += loss * static_cast<double>(batch->inputs.size(0));
      samples += batch->inputs.size(0);
      ++steps;
      if (progress) progress->update(steps, loss_sum / static_cast<double>(samples), samples);
    }
    const bool save = args.save_every > 0 && ((epoch + 1) % args.save_every == 0 || epoch + 1 == args.epochs);
    if (save) dp->consolidate_state_dict();  // every process: ZeRO across processes gathers the optimizer here
    if (!prints) continue;  // evaluation, checkpoints and the report are process 0's
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    accuracy = evaluate();
    double rate = static_cast<double>(samples) / seconds;
    char summary[224];
    std::snprintf(summary, sizeof summary, "loss %.4f  test accuracy %.4f  %.0f samples/s  %.1f s",
                  loss_sum / static_cast<double>(samples), accuracy, rate, seconds);
    if (dp->grad_scaler() != nullptr) {  // --precision fp16
      const size_t used = std::strlen(summary);
      std::snprintf(summary + used, sizeof summary - used, "  loss scale %g, %lld steps skipped",
                    dp->last_step().loss_scale, static_cast<long long>(skipped));
    }
    progress->finish(summary);
    epoch_records.push_back({.epoch = epoch + 1,
                             .train_loss = loss_sum / static_cast<double>(samples),
                             .test_accuracy = accuracy,
                             .loss_scale = dp->last_step().loss_scale,
                             .samples_per_s = rate,
                             .seconds = seconds,
                             .skipped_steps = skipped});
    if (save) {
      // Replicas are identical (DDP) or the master holds the model (DP): replica 0 is the model.
      io::TrainingState state{.epoch = epoch + 1, .step = (epoch + 1) * loader.num_batches()};
      record_configuration(args.configuration, state);
      if (const optim::GradScaler* scaler = dp->grad_scaler()) state.grad_scaler = scaler->state_dict();
      io::save_checkpoint(args.checkpoint, dp->module(), &dp->optimizer(0), state);
      std::fprintf(stderr, "saved %s (epoch %lld)\n", args.checkpoint.c_str(), static_cast<long long>(epoch + 1));
    }
  }
  if (!prints) return;
  std::printf("final test accuracy %.4f\n", accuracy);
  if (!args.json.empty()) write_json(args, *dp, slice.count, accuracy, epoch_records, recovered_failures);
}

}  // namespace

// The options of --model llama (train_llm.h).
std::vector<CLI::Option*> add_llm_options(CLI::App& cmd, TrainArgs& args) {
  LlmOptions& llm = args.llm;
  std::vector<CLI::Option*> options = {
      cmd.add_option("--llama-preset", llm.preset, "llama: the model's preset (layers/llama.h): tiny, small, 124m")
          ->check(CLI::IsMember(nn::kLlamaPresetNames)),
      add_int_option(cmd, "--seq-len", llm.seq_len, "llama: tokens per row (default: the preset's longest)", 1,
                     int64_t{1} << 20),
      add_int_option(cmd, "--dim", llm.dim, "llama: model width (default: the preset's; the SwiGLU width scales "
                     "with it)", 1, 1 << 20),
      add_int_option(cmd, "--layers", llm.layers, "llama: blocks (default: the preset's)", 1, 4096),
      add_int_option(cmd, "--heads", llm.heads, "llama: query heads (default: the preset's)", 1, 4096),
      add_int_option(cmd, "--kv-heads", llm.kv_heads, "llama: key/value heads (grouped-query attention; default: "
                     "the preset's)", 1, 4096),
      cmd.add_option("--packing", llm.packing, "llama: packed (llm.c: contiguous windows) or document (one document "
                     "per row, padded)")->check(CLI::IsMember({"packed", "document"})),
      add_int_option(cmd, "--max-steps", llm.max_steps, "llama: optimizer steps in all, counting a resumed run's",
                     1, int64_t{1} << 40),
      add_int_option(cmd, "--stop-at-step", llm.stop_at_step, "llama: end after this step, on --max-steps' schedule "
                     "(a job of a time-limited allocation; --resume goes on)", 1, int64_t{1} << 40),
      add_int_option(cmd, "--warmup-steps", llm.warmup_steps, "llama: linear warm-up steps (default: max-steps / 10)",
                     0, int64_t{1} << 40),
      add_real_option(cmd, "--min-lr-ratio", llm.min_lr_ratio, "llama: the cosine's floor, a fraction of --lr", 0,
                      false),
      add_real_option(cmd, "--grad-clip", llm.grad_clip, "llama: clip_grad_norm_'s max norm (0: none)", 0, false),
      add_int_option(cmd, "--grad-accum", llm.grad_accum, "llama: micro-batches of --batch-size per step (ddp: "
                     "no_sync on all but the last)", 1, 1 << 20),
      add_int_option(cmd, "--eval-every", llm.eval_every, "llama: validation loss every N steps (and at the end)",
                     0, int64_t{1} << 40),
      add_int_option(cmd, "--eval-batches", llm.eval_batches, "llama: validation batches per evaluation", 1, 1 << 20),
  };
  return options;
}

// The names of the options among `options` that the command line gave.
std::vector<std::string> given(const std::vector<CLI::Option*>& options) {
  std::vector<std::string> names;
  for (const CLI::Option* option : options) {
    if (option->count() > 0) names.push_back(option->get_name());
  }
  return names;
}

void add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a built-in model (mlp, cnn, tiny-llama; llama on token shards) "
                                     "in single, DP or DDP mode");
  cmd->add_option("--model", args->engine.model, "model: mlp, cnn, tiny-llama (by epochs); llama (a preset, by steps "
                  "on dpe tokenize's shards)")->check(CLI::IsMember(kTrainModels));
  cmd->add_option("--mode", args->engine.mode, "single device, DataParallel or DistributedDataParallel")
      ->check(CLI::IsMember(kModes));
  CLI::Option* device_ids = cmd->add_option("--device-ids", args->device_ids,
                  "devices, e.g. cpu:0,cpu:1 (default: every CUDA device, else --cpu-devices CPU devices)");
  CLI::Option* cpu_devices = add_int_option(*cmd, "--cpu-devices", args->cpu_devices,
                                            "CPU devices cpu:0 ... (default: 2 where there is no GPU)", 1, kMaxDevices);
  cpu_devices->excludes(device_ids);  // one or the other: a count beside a list would be ignored
  cmd->add_option("--output-device", args->output_device, "dp mode only: where DP gathers outputs (default: the first device)");
  add_int_option(*cmd, "--batch-size", args->batch_size,
                 "global batch (split across the devices; in ddp mode every device needs a sample of it)", 1,
                 int64_t{1} << 31);
  CLI::Option* drop_last = cmd->add_flag("--drop-last", args->drop_last,
                "drop each epoch's short last batch; without it, ddp mode pads that batch to a multiple of the "
                "device count with samples from the start of the epoch (DistributedSampler's rule), so every "
                "device gets an equal shard");
  CLI::Option* epochs = add_int_option(*cmd, "--epochs", args->epochs, "epochs (in all, counting those of a resumed checkpoint)", 1, 1000000);
  CLI::Option* lr = add_real_option(*cmd, "--lr", args->optimizer.lr, "learning rate (llama: default 6e-4)", 0, true);
  CLI::Option* optimizer = cmd->add_option("--optimizer", args->optimizer.name, "optimizer (llama: default adamw, "
                                           "weight decay on matrices only)")
                               ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  add_real_option(*cmd, "--momentum", args->optimizer.momentum, "SGD momentum", 0, false);
  CLI::Option* schedule = cmd->add_option("--schedule", args->schedule, "learning rate: constant, or cosine decay to 0 over the run (per step)")
      ->check(CLI::IsMember({"constant", "cosine"}));
  CLI::Option* weight_decay =
      add_real_option(*cmd, "--weight-decay", args->optimizer.weight_decay, "weight decay (llama: default 0.1)", 0, false);
  cmd->add_flag("--sync-bn", args->engine.sync_bn, "DDP: BatchNorm layers become SyncBatchNorm");
  cmd->add_flag("--activation-checkpointing", args->engine.activation_checkpointing, kActivationCheckpointingHelp);
  cmd->add_flag("--channels-last", args->channels_last, "the images in channels-last memory, PyTorch's "
                "memory_format=torch.channels_last (faster CPU convolutions; docs/LAYERS.md)");
  cmd->add_flag("--cudnn-benchmark", args->cudnn_benchmark, kCudnnBenchmarkHelp);
  CLI::Option* deterministic =
      cmd->add_flag("--deterministic", args->engine.deterministic, "dp/ddp: bitwise the same training for any "
                    "device count and either mode (virtual shards summed in a fixed order; docs/DATA_PARALLEL.md)");
  // needs(Option*), not needs("--deterministic"): CLI11 looks a name up in a noexcept function, where running
  // out of memory ends in std::terminate.
  add_int_option(*cmd, "--virtual-shards", args->engine.virtual_shards,
                 "--deterministic: virtual shards per batch (default max(4, devices))", 1, 1 << 20)
      ->needs(deterministic);
  cmd->add_option("--on-device-failure", args->on_device_failure, "when a device fails in a step: fail; drop_device "
                  "(redo the step on the others and go on); retry_smaller_chunk (out of memory: halve its share)")
      ->check(CLI::IsMember(kDeviceFailurePolicies));
  add_real_option(*cmd, "--timeout", args->engine.timeout_s, "seconds one device may keep the others waiting: the "
                  "collectives' timeout, and how long after another device finished its work a device still busy "
                  "is declared lost (stuck in a kernel; docs/DATA_PARALLEL.md)", 0, true);
  add_fault_injection_options(*cmd, args->faults);
  cmd->add_option("--precision", args->engine.precision, "fp32; bf16 (autocast: bfloat16 products with float32 "
                  "accumulation and master weights); fp16 (CUDA only, with a gradient scaler; docs/MIXED_PRECISION.md)")
      ->check(CLI::IsMember(kPrecisions));
  add_int_option(*cmd, "--zero", args->engine.zero_stage, "ddp: ZeRO stage; 1: each device keeps the optimizer "
                 "state of 1/n of the parameters, 2: and 1/n of the gradients (docs/DATA_PARALLEL.md \"Memory\")",
                 0, 2);
  cmd->add_option("--reduce-dtype", args->engine.reduce_dtype, "ddp: the dtype gradient buckets are all-reduced in "
                  "(bf16 halves the bytes; docs/MIXED_PRECISION.md)")
      ->check(CLI::IsMember(kReduceDtypes));
  cmd->add_option("--split", args->split, "dp and ddp's split of each batch over the devices: chunk (PyTorch's), "
                  "balanced, auto (chunks follow each device's measured speed; docs/DATA_PARALLEL.md)")
      ->check(CLI::IsMember(kSplitRules));
  add_dist_option(*cmd, args->dist, "ddp or dp mode over the devices of every process of an MPI launch; "
                  "--batch-size is the global batch over all of them; process 0 prints, evaluates and writes "
                  "--checkpoint and --json; every other option must be the same on every process but " +
                  option_list(kMayDifferPerProcess) + " (the data and checkpoint read must hold the same bytes)");
  add_seed_option(*cmd, "--seed", args->engine.seed, "initial weights and data order");
  CLI::Option* limit = add_int_option(*cmd, "--limit", args->limit, "use only the first N training samples", 1, int64_t{1} << 40)
      ->default_str("all");
  add_path_option(*cmd, "--data-dir,--data", args->data_dir, "Fashion-MNIST directory, the text file for tiny-llama, "
                  "or the token shards' directory for llama (dpe tokenize --out)");
  add_int_option(*cmd, "--save-every", args->save_every,
                 "checkpoint every N epochs (llama: steps) and at the end (replica 0, atomic); 0: never", 0, 1000000);
  const std::vector<CLI::Option*> llm_options = add_llm_options(*cmd, *args);
  CLI::Option* checkpoint =
      add_path_option(*cmd, "--checkpoint", args->checkpoint, "checkpoint path for --save-every (checked at start-up)");
  add_path_option(*cmd, "--resume", args->engine.resume, "continue from this checkpoint (the epoch after the saved one); "
                  "every option that shaped its run must be the same (docs/RELIABILITY.md, \"A run's configuration\")");
  add_name_list_option(*cmd, "--override", args->overrides, "--resume: options the resumed run may change, by name "
                       "without the dashes (lr,batch-size); what changed is printed; these may change without it: " +
                       option_list(kMayChangeOnResume));
  add_path_option(*cmd, "--json", args->json, "write the final report as JSON to this file (checked at start-up)");
  cmd->callback([=] {
    args->cpu_devices_given = cpu_devices->count() > 0;
    args->checkpoint_given = checkpoint->count() > 0;
    args->llm_options_given = given(llm_options);
    args->epoch_options_given = given({epochs, limit, drop_last, schedule});
    args->optimizer_given = optimizer->count() > 0;
    args->lr_given = lr->count() > 0;
    args->weight_decay_given = weight_decay->count() > 0;
    args->configuration = run_configuration(*cmd, kMayChangeOnResume);
    args->process_configuration = run_configuration(*cmd, kMayDifferPerProcess);
    run_train(*args);
  });
}

}  // namespace dpe::tool
