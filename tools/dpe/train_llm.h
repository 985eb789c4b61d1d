// dpe train --model llama: pretraining a Llama of a preset (layers/llama.h) on llm.c token shards
// (data/token_loader.h), the tutorials' loop: AdamW with weight decay on matrices only, linear warm-up then
// cosine to a floor, clip_grad_norm_ over the reduced gradients, gradient accumulation (DDP: no_sync on every
// micro-step but the last), validation loss and perplexity every N steps, checkpoints every N steps that
// hold the model without any `module.` prefix and the loader's position, and a progress line with loss,
// tokens/s and MFU (core/peak_flops.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "layers/llama.h"
#include "tools/dpe/training.h"

namespace dpe::tool {

struct LlmOptions {
  std::string preset = "tiny";   // layers/llama.h's llama_preset
  std::string data;              // a directory of <name>_train_*.bin and <name>_val_*.bin, and tokenizer.model
  int64_t seq_len = 0;           // 0: the preset's max_seq_len
  // Overrides of the preset (0: the preset's): width, depth, query heads, key/value heads (GQA).
  int64_t dim = 0, layers = 0, heads = 0, kv_heads = 0;
  std::string packing = "packed";  // data::Packing: packed (llm.c) or document (one document per row)
  int64_t max_steps = 100;       // optimizer steps in all, counting those of a resumed checkpoint: the schedule's
  int64_t stop_at_step = 0;      // > 0: end after this step (a job of a time-limited allocation; resume goes on)
  int64_t warmup_steps = -1;     // -1: max_steps / 10
  double min_lr_ratio = 0.1;     // the cosine's floor, as a fraction of --lr
  double grad_clip = 1.0;        // clip_grad_norm_'s max_norm; 0: no clipping
  int64_t grad_accum = 1;        // micro-batches of --batch-size per optimizer step
  int64_t eval_every = 0;        // 0: only at the end (when there is a validation split)
  int64_t eval_batches = 4;      // validation batches per evaluation
  int64_t save_every = 0;        // checkpoint every N steps and at the end; 0: never
};

// Where the run writes, and how big its batches are.
struct LlmRun {
  int64_t batch_size = 0;  // windows per micro-step, over every process
  std::string checkpoint;  // with options.save_every > 0
  std::string json;        // "" : no report
  std::map<std::string, std::string> configuration;  // recorded in every checkpoint (run_configuration.h's RunConfiguration)
};

// What the data directory holds, read once before anything is built: the vocabulary and special ids of its
// tokenizer.model (without one, the preset's vocabulary and GPT-2's <|endoftext|> as the document separator),
// and the shards' paths.
struct LlmData {
  int64_t vocab_size = 0;  // 0: the preset's default
  int64_t bos = 50256, pad = 0;
  std::vector<std::string> train_shards, val_shards;
};
// Throws naming the directory when it holds no training shards, or no validation shards while --eval-every asks
// for evaluations. Reads no shard's contents.
LlmData open_llm_data(const LlmOptions& options);

// The model's configuration from the preset, the overrides and the data's vocabulary.
nn::LlamaConfig llama_config(const LlmOptions& options, const LlmData& data);

// The preset's configuration with the given overrides (0: keep): --dim scales the SwiGLU width with it (the
// preset's ratio); --heads alone keeps the preset's key/value heads where they still divide the heads, else
// takes one per head. Throws naming the values (layers/llama.h's check_llama_config).
void apply_overrides(nn::LlamaConfig& config, int64_t dim, int64_t layers, int64_t heads, int64_t kv_heads);

// Every LlmOptions check that needs no data: the preset, the packing, the step counts, the ratios. Throws
// naming the option and the value.
void check_llm_options(const LlmOptions& options);

// The run. corpus: open_llm_data(options); engine.llama: llama_config(options, corpus); the devices, paths and
// resume checkpoint checked; `resumed`: the checkpoint's training state (read_checkpoint_state; unused without
// engine.resume).
void run_train_llm(const EngineOptions& engine, const OptimizerOptions& optimizer, const LlmOptions& options,
                   const LlmData& corpus, const LlmRun& run, const io::TrainingState& resumed);

}  // namespace dpe::tool
