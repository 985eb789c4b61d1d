// TokenLoader: language-model batches from llm.c token shards (data/token_shards.h).
//
//   data::TokenLoader loader(data::list_shards(dir, "train"),
//                            {.seq_len = 1024, .batch_size = 64, .seed = 42, .vocab_size = 50257,
//                             .num_processes = world, .process_rank = rank});
//   for (int64_t step = 0; step < steps; ++step) {
//     data::TokenBatch batch = loader.next_batch();      // this process's rows of the global batch
//     Tensor logits = dp.forward(batch.inputs);           // DataParallel splits them over the devices
//     loss = cross_entropy(logits.view({-1, vocab}), batch.targets.view({-1}));   // ignore_index -100
//   }
//   checkpoint.metadata["token_loader"] = loader.state().to_json();   // io/checkpoint.h TrainingState
//
// Windows. A window is seq_len + 1 = T + 1 consecutive tokens of one shard; its row is
//     inputs = window[0 : T]      targets = window[1 : T + 1]
// Packing::Packed (llm.c): shard s of n tokens gives the windows starting at 0, T, 2T, ... that fit whole,
// floor((n - 1) / T) of them (consecutive windows share one token, so every token but a shard's first is a
// target once); the shard's shorter tail is dropped; no window crosses a shard boundary. Windows are numbered
// shard by shard, in the order of the list.
// Packing::Document: a document starts at each `bos` token and at the start of each shard, and runs up to the
// next document's start (documents never cross a shard boundary: a document that llm.c split across two
// shards is two documents here). A document of L >= 2 tokens gives ceil((L - 1) / T) windows starting at 0, T,
// 2T, ... within it, each holding min(T + 1, L - start) real tokens; a window with r < T + 1 real tokens is
// padded: input positions j >= r hold `pad` and padding_mask 0 (1 elsewhere), and target positions j >= r - 1
// hold ignore_index (nothing to predict past the document's end). A document of one token (a lone BOS) has
// nothing to predict and gives no window.
//
// Order and split (the contract of data/distributed_sampler.h and docs/DATA.md for Fashion-MNIST). With W
// windows and a global batch of B windows per step:
//  1. epoch e's order is DistributedSampler(W, {.num_replicas = 1, .shuffle, .seed}) at set_epoch(e): a
//     permutation of 0..W-1 that is a pure function of (W, seed, epoch), or 0..W-1 without shuffle;
//  2. drop_last: an epoch has W / B steps; the last W % B windows of the order are not read that epoch;
//  3. step k's global batch is order[k*B : (k+1)*B]; process p of P takes its contiguous slice, rows
//     [p*B/P, (p+1)*B/P) (B must be a multiple of P), so the P slices concatenated are the one-process batch.
// Nothing else enters: the batches do not depend on the devices, the process count or the history of calls.
// After an epoch's last step the next call starts the next epoch (an endless stream, like llm.c's loader).
//
// Checkpoints: state() is the position of the next batch (epoch, step_in_epoch, seed) and what identifies the
// data and packing; restore(state) continues with exactly the batch the saved loader would have returned next.
// The process count may differ between save and restore (the position counts global batches).
//
// Errors (dpe::Error): no shards, seq_len outside [1, kMaxShardTokens - 1], batch_size < 1, num_processes < 1,
// process_rank outside [0, num_processes), batch_size not a multiple of num_processes (naming the nearest
// multiples), Document without a bos >= 0, a bos or pad >= vocab_size (when vocab_size > 0), fewer windows than
// one global batch (naming both numbers), every shard's own error (TokenShard::open), and a state that does not
// match (restore, naming what differs).
//
// Thread-safety: one thread at a time; the shards must not change while the loader lives (they are mapped).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/token_shards.h"

namespace dpe::data {

enum class Packing { Packed, Document };

// "packed", "document".
const char* packing_name(Packing packing);

struct TokenLoaderOptions {
  int64_t seq_len = 0;     // T >= 1: tokens per row
  int64_t batch_size = 0;  // B >= 1: windows per step over every process (the global batch)
  Packing packing = Packing::Packed;
  bool shuffle = true;
  uint64_t seed = 0;       // the same on every process
  int64_t vocab_size = 0;  // > 0: every token of every shard checked at open (TokenShard::open); 0: not checked
  int64_t bos = -1;        // Document: the token that starts a document (GPT-2's <|endoftext|> is 50256)
  int64_t pad = 0;         // Document: the input token at padded positions
  int64_t ignore_index = -100;  // Document: the target at padded positions (cross_entropy's default)
  int64_t num_processes = 1;    // P >= 1
  int64_t process_rank = 0;     // 0 <= p < P
};

struct TokenBatch {
  Tensor inputs;        // (B / P, T) int64 on cpu:0: window[0 : T]
  Tensor targets;       // (B / P, T) int64 on cpu:0: window[1 : T + 1]; ignore_index where padded (Document)
  Tensor padding_mask;  // (B / P, T) int64 on cpu:0, 1 = real input token, 0 = padding (Document; nn::TinyLlama's
                        // key_padding_mask takes any dtype, nonzero = real); undefined for Packed
  int64_t epoch = 0;    // the batch's position: epoch and step in it
  int64_t step = 0;
};

// One shard as a state identifies it: its file name (not the directory, so data moved elsewhere still resumes)
// and its token count.
struct ShardId {
  std::string name;
  int64_t tokens = 0;
  bool operator==(const ShardId&) const = default;
};

struct TokenLoaderState {
  int64_t epoch = 0;          // of the next batch
  int64_t step_in_epoch = 0;  // of the next batch, in [0, batches_per_epoch)
  uint64_t seed = 0;
  // What the loader that restores must have (restore checks each): the data, the windows and the batch.
  std::vector<ShardId> shards;
  int64_t seq_len = 0;
  int64_t batch_size = 0;
  Packing packing = Packing::Packed;
  bool shuffle = true;
  int64_t bos = -1;
  int64_t pad = 0;
  int64_t ignore_index = -100;

  // A JSON object with one member per field ("packing": "packed" or "document"; "shards": [{"name", "tokens"}]).
  std::string to_json() const;
  // Strict: every field present with its type, no other key, no duplicate (io/safetensors_header.h's parser);
  // dpe::Error naming the key otherwise.
  static TokenLoaderState from_json(const std::string& text);
};

class TokenLoader {
 public:
  // Opens every shard (TokenShard::open with options.vocab_size) and indexes its windows.
  TokenLoader(const std::vector<std::string>& shard_paths, TokenLoaderOptions options);

  // The batch at the current position, then advances (to the next epoch after its last step).
  TokenBatch next_batch();

  int64_t num_windows() const { return static_cast<int64_t>(num_windows_); }
  int64_t batches_per_epoch() const { return num_windows() / options_.batch_size; }
  int64_t rows_per_process() const { return options_.batch_size / options_.num_processes; }
  int64_t epoch() const { return epoch_; }
  int64_t step_in_epoch() const { return step_; }
  const TokenLoaderOptions& options() const { return options_; }

  // Moves to step 0 of `epoch` (>= 0): DistributedSampler's set_epoch.
  void set_epoch(int64_t epoch);

  TokenLoaderState state() const;
  // Checks that the state's shards, seq_len, batch_size, packing, shuffle, bos, pad and ignore_index are this
  // loader's (naming the first difference) and its position is one of this data's; then takes its position
  // and its seed.
  void restore(const TokenLoaderState& state);

 private:
  // A window: `length` real tokens of shard `shard` from token `start` (length == T + 1 unless padded).
  struct Window {
    int64_t start;
    int32_t shard;
    int32_t length;
  };
  Window window(int64_t w) const;
  const std::vector<int64_t>& order();  // this epoch's order, computed once per epoch

  TokenLoaderOptions options_;
  std::vector<TokenShard> shards_;
  // Packed: windows_before_[s] = windows of the shards before s (size shards + 1). Document: windows_.
  std::vector<int64_t> windows_before_;
  std::vector<Window> windows_;
  size_t num_windows_ = 0;
  int64_t epoch_ = 0;
  int64_t step_ = 0;
  int64_t order_epoch_ = -1;  // the epoch order_ belongs to
  std::vector<int64_t> order_;
};

}  // namespace dpe::data
