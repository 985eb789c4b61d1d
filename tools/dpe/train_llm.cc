#include "tools/dpe/train_llm.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/ops.h"
#include "core/peak_flops.h"
#include "data/token_loader.h"
#include "data/tokenizer.h"
#include "layers/loss.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "tools/dpe/cli_util.h"
#include "tools/dpe/json_report.h"
#include "tools/dpe/progress.h"
#include "tools/dpe/run_configuration.h"

namespace dpe::tool {

namespace {

data::Packing packing_of(const std::string& name) {
  DPE_CHECK(name == "packed" || name == "document", "--packing ", name, ": expected packed or document");
  return name == "packed" ? data::Packing::Packed : data::Packing::Document;
}

// Note [The loss of a batch with padding]
// The step's loss is the mean over the global batch's real targets (PyTorch's cross_entropy mean over the
// tokens that are not ignore_index), in DP and DDP alike: a replica's loss is its shard's sum x rows /
// (its rows x tokens), so that DDP's weighting of each shard by its share of the rows (rows_r / rows) adds up
// to sum / tokens, DP's loss of the whole batch. Divided by the micro-steps of an accumulated step too. Right padding needs no attention mask: a causal model's real tokens never
// attend to the padded positions after them, and the loss ignores those positions' targets. Across processes
// each process counts its own slice's tokens (exact for packed data, where every row has seq_len targets).
LossFn llm_loss(int64_t rows, int64_t tokens, int64_t grad_accum) {
  return [rows, tokens, grad_accum](const Tensor& logits, const Tensor& target) {
    const int64_t vocab = logits.size(-1);
    Tensor sum = nn::functional::cross_entropy(logits.reshape({-1, vocab}), target.reshape({-1}),
                                               {.reduction = nn::Reduction::Sum});
    const double scale = static_cast<double>(rows) /
                         (static_cast<double>(target.size(0)) * static_cast<double>(tokens) *
                          static_cast<double>(grad_accum));
    return sum * scale;
  };
}

int64_t real_targets(const Tensor& targets, int64_t ignore_index) {
  int64_t count = 0;
  for (int64_t t : targets.to_vector<int64_t>()) count += t != ignore_index;
  return count;
}

// The validation loss: the mean over `batches` batches of the model's (replica 0's) token loss; its exp() is
// the perplexity.
double validation_loss(DataParallel& dp, data::TokenLoader& val, int64_t batches, const std::string& precision) {
  NoGradGuard no_grad;
  PrecisionScope scope(precision, dp.device_ids());
  const Device& device = dp.device_ids()[0];
  val.set_epoch(0);
  double sum = 0;
  int64_t tokens = 0;
  for (int64_t b = 0; b < batches; ++b) {
    const data::TokenBatch batch = val.next_batch();
    Tensor logits = dp.module().forward(batch.inputs.to(device));
    Tensor loss = nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                batch.targets.to(device).reshape({-1}), {.reduction = nn::Reduction::Sum});
    sum += loss.item();
    tokens += real_targets(batch.targets, val.options().ignore_index);
  }
  return tokens > 0 ? sum / static_cast<double>(tokens) : 0.0;
}

struct StepRecord {
  int64_t step = 0;
  double train_loss = 0, val_loss = -1, tokens_per_s = 0, mfu = 0, lr = 0;
};

void write_report(const LlmRun& run, const EngineOptions& engine, const LlmOptions& options,
                  const nn::LlamaConfig& config, const std::vector<StepRecord>& records, const StepReport& last) {
  JsonReport report = JsonReport::object();
  const DisposeOnExit dispose_report(report);
  report["model"] = "llama";
  report["preset"] = options.preset;
  report["mode"] = engine.mode;
  report["parameters"] = nn::llama_size(config).num_params;
  report["batch_size"] = run.batch_size;
  report["seq_len"] = options.seq_len;
  report["grad_accum"] = options.grad_accum;
  JsonReport& memory = report["peak_memory_mb"] = JsonReport::object();
  for (const auto& [device, stats] : last.memory) {
    memory[device.str()] = as_printed("%.1f", static_cast<double>(stats.peak_allocated_bytes) / 1e6);
  }
  JsonReport& lines = report["steps"] = JsonReport::array();
  for (const StepRecord& r : records) {
    JsonReport& line = lines.emplace_back(JsonReport::object());
    line["step"] = r.step;
    line["train_loss"] = as_printed("%.6f", r.train_loss);
    if (r.val_loss >= 0) line["val_loss"] = as_printed("%.6f", r.val_loss);
    line["tokens_per_s"] = as_printed("%.1f", r.tokens_per_s);
    line["mfu"] = as_printed("%.4f", r.mfu);
    line["lr"] = as_printed("%.6g", r.lr);
  }
  write_json_report("--json", run.json, report);
}

// The loop's state that survives a mode switch or a dropped device: the schedulers are made again then.
struct Schedules {
  std::vector<std::unique_ptr<optim::LRScheduler>> schedulers;
  void make(DataParallel& dp, const OptimizerOptions& optimizer, const LlmOptions& options, int64_t steps_done) {
    schedulers.clear();
    for (size_t r = 0; r < dp.num_optimizers(); ++r) {
      for (optim::ParamGroup& group : dp.optimizer(r).param_groups()) group.lr = optimizer.lr;
      schedulers.push_back(std::make_unique<optim::CosineWithWarmup>(
          dp.optimizer(r), options.warmup_steps, options.max_steps, optimizer.lr * options.min_lr_ratio));
      if (steps_done > 0) schedulers.back()->set_last_epoch(steps_done);
    }
  }
};

}  // namespace

void apply_overrides(nn::LlamaConfig& config, int64_t dim, int64_t layers, int64_t heads, int64_t kv_heads) {
  if (dim > 0) {
    config.hidden_dim = config.hidden_dim * dim / config.dim;  // the preset's SwiGLU ratio
    config.dim = dim;
  }
  if (layers > 0) config.num_layers = layers;
  if (heads > 0) {
    config.num_heads = heads;
    if (kv_heads == 0 && config.num_kv_heads > 0 && heads % config.num_kv_heads != 0) config.num_kv_heads = heads;
  }
  if (kv_heads > 0) config.num_kv_heads = kv_heads;
  nn::check_llama_config(config);
}

void check_llm_options(const LlmOptions& options) {
  nn::llama_preset(options.preset);  // names the presets when it is not one
  packing_of(options.packing);
  DPE_CHECK(options.max_steps >= 1, "--max-steps ", options.max_steps, ": expected at least 1");
  DPE_CHECK(options.stop_at_step >= 0 && options.stop_at_step <= options.max_steps, "--stop-at-step ",
            options.stop_at_step, ": expected a step in [1, --max-steps ", options.max_steps, "]");
  DPE_CHECK(options.warmup_steps < options.max_steps, "--warmup-steps ", options.warmup_steps,
            " must be below --max-steps ", options.max_steps);
  DPE_CHECK(options.min_lr_ratio >= 0 && options.min_lr_ratio <= 1, "--min-lr-ratio ", options.min_lr_ratio,
            ": expected a fraction in [0, 1]");
  DPE_CHECK(options.grad_clip >= 0 && std::isfinite(options.grad_clip), "--grad-clip ", options.grad_clip,
            ": expected a finite number >= 0 (0: no clipping)");
  DPE_CHECK(options.grad_accum >= 1, "--grad-accum ", options.grad_accum, ": expected at least 1");
  DPE_CHECK(options.eval_batches >= 1, "--eval-batches ", options.eval_batches, ": expected at least 1");
  DPE_CHECK(!options.data.empty(), "--data: the llama model trains on token shards (dpe tokenize writes them); "
            "give their directory");
}

LlmData open_llm_data(const LlmOptions& options) {
  LlmData out;
  out.train_shards = data::list_shards(options.data, "train");  // none: refused before any work
  try {
    out.val_shards = data::list_shards(options.data, "val");
  } catch (const Error&) {
    DPE_CHECK(options.eval_every == 0, "--eval-every ", options.eval_every, ": ", options.data,
              " has no validation shards (*_val_*.bin)");
  }
  const std::string model = options.data + "/tokenizer.model";
  struct stat st{};
  if (::stat(model.c_str(), &st) == 0) {
    const data::Tokenizer tokenizer = data::Tokenizer::load(model);
    out.vocab_size = tokenizer.vocab_size();
    out.bos = tokenizer.bos_id();
    out.pad = tokenizer.pad_id();
  }
  return out;
}

nn::LlamaConfig llama_config(const LlmOptions& options, const LlmData& data) {
  nn::LlamaConfig config = nn::llama_preset(options.preset, data.vocab_size);
  apply_overrides(config, options.dim, options.layers, options.heads, options.kv_heads);
  if (options.seq_len > 0) {
    DPE_CHECK(options.seq_len <= config.max_seq_len, "--seq-len ", options.seq_len, " is longer than the ",
              options.preset, " preset's ", config.max_seq_len, " positions");
  }
  nn::check_llama_config(config);
  return config;
}

namespace {

// One optimizer step: --grad-accum micro-batches (DDP: every one but the last under no_sync), clipping of the
// reduced gradients, the optimizer. Returns the step's loss.
double train_one_step(DataParallel& dp, data::TokenLoader& loader, const LlmOptions& options,
                      const std::string& precision) {
  dp.zero_grad();
  double loss = 0;
  for (int64_t micro = 0; micro < options.grad_accum; ++micro) {
    const data::TokenBatch batch = loader.next_batch();
    const int64_t tokens = std::max<int64_t>(1, real_targets(batch.targets, loader.options().ignore_index));
    const LossFn loss_fn = llm_loss(batch.inputs.size(0), tokens, options.grad_accum);
    PrecisionScope scope(precision, dp.device_ids());
    if (micro + 1 < options.grad_accum) {
      NoSyncGuard no_sync = dp.no_sync();
      loss += dp.forward_backward(batch.inputs, batch.targets, loss_fn);
    } else {
      loss += dp.forward_backward(batch.inputs, batch.targets, loss_fn);
    }
  }
  if (options.grad_clip > 0) {
    if (optim::GradScaler* scaler = dp.grad_scaler()) {
      for (size_t r = 0; r < dp.num_optimizers(); ++r) scaler->unscale_(dp.optimizer(r));
    }
    dp.clip_grad_norm(options.grad_clip);  // the reduced gradients' norm, in every mode and ZeRO stage
  }
  dp.optimizer_step();
  return loss;
}

void print_header(const LlmOptions& options, const nn::LlamaConfig& config, const EngineOptions& engine,
                  const DataParallel& dp, const LlmRun& run, int64_t windows, int64_t first_step,
                  const std::optional<PeakFlops>& peak) {
  std::printf("dpe train: llama %s (%lld parameters, %lld layers, dim %lld, %lld/%lld heads), mode %s on %s, "
              "global batch %lld x %lld tokens x %lld micro-steps, %lld training windows%s\n",
              options.preset.c_str(), static_cast<long long>(nn::llama_size(config).num_params),
              static_cast<long long>(config.num_layers), static_cast<long long>(config.dim),
              static_cast<long long>(config.num_heads), static_cast<long long>(config.kv_heads()),
              engine.mode.c_str(), device_list_str(dp.device_ids()).c_str(), static_cast<long long>(run.batch_size),
              static_cast<long long>(options.seq_len), static_cast<long long>(options.grad_accum),
              static_cast<long long>(windows),
              first_step > 0 ? (" (resumed after step " + std::to_string(first_step) + ")").c_str() : "");
  if (peak) std::printf("# MFU against %s\n", peak->source.c_str());
  std::fflush(stdout);
}

// Replica 0 is the model (DP's master, or any of DDP's identical replicas): its own names, no prefix.
void save(DataParallel& dp, const data::TokenLoader& loader, const LlmRun& run, int64_t step) {
  io::TrainingState state{.epoch = loader.epoch(), .step = step, .metadata = {{"token_loader", loader.state().to_json()}}};
  record_configuration(run.configuration, state);
  if (const optim::GradScaler* scaler = dp.grad_scaler()) state.grad_scaler = scaler->state_dict();
  io::save_checkpoint(run.checkpoint, dp.module(), &dp.optimizer(0), state);
}

// The summary, the validation loss and what the mode keeps on each device (DP's first one holds the gathered
// logits, the loss and the optimizer).
void print_summary(const std::vector<StepRecord>& records, Progress* progress, const StepReport& last) {
  const StepRecord& final_step = records.empty() ? StepRecord{} : records.back();
  char summary[200];
  std::snprintf(summary, sizeof summary, "loss %.4f  %.0f tokens/s  MFU %.1f%%", final_step.train_loss,
                final_step.tokens_per_s, 100 * final_step.mfu);
  if (progress) progress->finish(summary);
  if (final_step.val_loss >= 0) {
    std::printf("final validation loss %.4f, perplexity %.2f\n", final_step.val_loss, std::exp(final_step.val_loss));
  }
  std::string memory;
  for (const auto& [device, stats] : last.memory) {
    char entry[64];
    std::snprintf(entry, sizeof entry, "  %s %.1f MB", device.str().c_str(),
                  static_cast<double>(stats.peak_allocated_bytes) / 1e6);
    memory += entry;
  }
  std::printf("peak memory per device:%s\n", memory.c_str());
}

}  // namespace

void run_train_llm(const EngineOptions& engine, const OptimizerOptions& optimizer, const LlmOptions& given,
                   const LlmData& corpus, const LlmRun& run, const io::TrainingState& resumed) {
  LlmOptions options = given;
  const nn::LlamaConfig& config = *engine.llama;
  if (options.seq_len == 0) options.seq_len = config.max_seq_len;
  if (options.warmup_steps < 0) options.warmup_steps = options.max_steps / 10;
  const int64_t end_step = options.stop_at_step > 0 ? options.stop_at_step : options.max_steps;
  std::unique_ptr<DataParallel> dp = make_engine(engine, optimizer);
  const ProcessSlice slice = process_slice(*dp, engine.dist.has_value(), run.batch_size);
  const bool prints = slice.reports();
  data::TokenLoaderOptions loader_options{.seq_len = options.seq_len, .batch_size = run.batch_size,
                                          .packing = packing_of(options.packing), .seed = engine.seed,
                                          .vocab_size = config.vocab_size, .bos = corpus.bos, .pad = corpus.pad,
                                          .num_processes = slice.count, .process_rank = slice.index};
  data::TokenLoader loader(corpus.train_shards, loader_options);
  std::optional<data::TokenLoader> val;  // process 0's, in order
  if (!corpus.val_shards.empty() && prints) {
    data::TokenLoaderOptions val_options = loader_options;
    val_options.shuffle = false;
    val_options.num_processes = 1;
    val_options.process_rank = 0;
    val.emplace(corpus.val_shards, val_options);
  }
  int64_t first_step = 0;
  if (!engine.resume.empty()) {
    const auto it = resumed.metadata.find("token_loader");
    DPE_CHECK(it != resumed.metadata.end(), "--resume ", engine.resume, ": the checkpoint has no token loader "
              "position (it was not written by dpe train --model llama)");
    loader.restore(data::TokenLoaderState::from_json(it->second));
    first_step = resumed.step;
  }
  Schedules schedules;
  schedules.make(*dp, optimizer, options, first_step);
  const int64_t tokens_per_step = run.batch_size * options.seq_len * options.grad_accum;
  const double flops_per_token = nn::llama_size(config, options.seq_len).train_flops_per_token;
  const ComputePrecision precision = engine.precision == "fp32" ? ComputePrecision::FP32 : ComputePrecision::BF16;
  const std::optional<PeakFlops> peak = peak_flops(dp->device_ids(), precision, slice.count);
  const double mfu_scale = peak ? flops_per_token / (peak->gflops * 1e9) : 0.0;
  if (prints) print_header(options, config, engine, *dp, run, loader.num_windows(), first_step, peak);
  std::optional<Progress> progress;
  if (prints) progress.emplace("train", std::max<int64_t>(0, end_step - first_step), ProgressRate{"tokens", mfu_scale});
  std::vector<StepRecord> records;
  const auto start = std::chrono::steady_clock::now();
  double loss_sum = 0;
  for (int64_t step = first_step; step < end_step; ++step) {
    const double loss = train_one_step(*dp, loader, options, engine.precision);
    for (auto& scheduler : schedules.schedulers) scheduler->step();
    if (!dp->last_step().recovered_failures.empty()) schedules.make(*dp, optimizer, options, step + 1);
    loss_sum += loss;
    const int64_t done = step + 1 - first_step;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (progress) progress->update(done, loss_sum / static_cast<double>(done), done * tokens_per_step);
    const bool last = step + 1 == end_step;
    StepRecord record{.step = step + 1, .train_loss = loss,
                      .tokens_per_s = static_cast<double>(done * tokens_per_step) / seconds,
                      .lr = dp->optimizer(0).param_groups()[0].lr};
    record.mfu = record.tokens_per_s * mfu_scale;
    if (val && ((options.eval_every > 0 && (step + 1) % options.eval_every == 0) || last)) {
      record.val_loss = validation_loss(*dp, *val, options.eval_batches, engine.precision);
      char line[96];
      std::snprintf(line, sizeof line, "step %lld: val loss %.4f, perplexity %.2f", static_cast<long long>(step + 1),
                    record.val_loss, std::exp(record.val_loss));
      progress->note(line);
    }
    if (prints) records.push_back(record);
    if (options.save_every > 0 && ((step + 1) % options.save_every == 0 || last)) {
      dp->consolidate_state_dict();  // every process: ZeRO across processes gathers the optimizer here
      if (prints) save(*dp, loader, run, step + 1);
    }
  }
  if (!prints) return;
  print_summary(records, progress ? &*progress : nullptr, dp->last_step());
  if (!run.json.empty()) write_report(run, engine, options, config, records, dp->last_step());
}

}  // namespace dpe::tool
