// Fuzz target: llm.c token shards (data/token_shards.h) and the loader over them (data/token_loader.h), on
// arbitrary file contents: the shards a training run is pointed at.
//
// The input is the shard file. It is opened without a vocabulary check, then with vocabularies of 256 and 65537,
// and a TokenLoader reads a few batches of it in both packings. Oracles: an accepted shard is exactly a header
// plus size() tokens of its version's width; operator[] and read() agree; version 1 tokens are < 2^16; a
// vocabulary check passes exactly when every token is below it; every batch row holds the shard's tokens in
// order with targets shifted by one (ignore_index past a document's end) and padding only at a row's end.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "data/token_loader.h"
#include "data/token_shards.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dpe;
  static fuzz::InputFile file("shard.bin");
  file.write(data, size);

  bool accepted = false;
  int64_t max_token = -1;
  fuzz::expect_only_dpe_errors("open", [&] {
    const data::TokenShard shard = data::TokenShard::open(file.path());
    fuzz::require(shard.version() == 1 || shard.version() == 7, "version 1 or 7");
    fuzz::require(data::kTokenShardHeaderBytes + shard.size() * shard.width() == static_cast<int64_t>(size),
                  "the file is the header and size() tokens, nothing more");
    std::vector<int64_t> tokens(static_cast<size_t>(shard.size()));
    shard.read(0, shard.size(), tokens.data());
    for (int64_t i = 0; i < shard.size(); ++i) {
      fuzz::require(tokens[i] == shard[i], "read() and operator[] agree");
      fuzz::require(shard.version() == 7 || tokens[i] < 65536, "version 1 tokens are uint16");
      max_token = std::max(max_token, tokens[i]);
    }
    accepted = true;
  });
  if (!accepted) return 0;

  for (const int64_t vocab : {int64_t{256}, int64_t{65537}}) {
    bool ok = false;
    fuzz::expect_only_dpe_errors("vocab", [&] {
      data::TokenShard::open(file.path(), vocab);
      ok = true;
    });
    fuzz::require(ok == (max_token < vocab), "the vocabulary check fails exactly on a token >= vocab_size");
  }

  const int64_t seq_len = 1 + static_cast<int64_t>(size % 4);
  for (const data::Packing packing : {data::Packing::Packed, data::Packing::Document}) {
    fuzz::expect_only_dpe_errors(data::packing_name(packing), [&] {
      data::TokenLoader loader({file.path()}, {.seq_len = seq_len, .batch_size = 2, .packing = packing, .seed = 1,
                                               .bos = 0, .pad = 0});
      for (int step = 0; step < 3; ++step) {
        const data::TokenBatch batch = loader.next_batch();
        const std::vector<int64_t> x = batch.inputs.to_vector<int64_t>(), y = batch.targets.to_vector<int64_t>();
        const std::vector<int64_t> m =
            batch.padding_mask.defined() ? batch.padding_mask.to_vector<int64_t>() : std::vector<int64_t>(x.size(), 1);
        for (size_t k = 0; k < x.size(); ++k) {
          const bool row_end = (k + 1) % static_cast<size_t>(seq_len) == 0;
          if (m[k] == 0) fuzz::require(x[k] == 0 && y[k] == -100, "padding: the pad input, ignore_index target");
          if (row_end) continue;
          fuzz::require(m[k] >= m[k + 1], "the real tokens are a prefix of the row");
          fuzz::require(m[k + 1] == 1 ? y[k] == x[k + 1] : y[k] == -100,
                        "the target is the next input token, ignore_index past the last one");
        }
      }
    });
  }
  return 0;
}
