// TextCorpus: a byte-level language-modelling corpus for the tiny-llama example.
//
//   data::TextCorpus corpus = data::load_text_corpus({data::kFortunesPath}, /*seq_len=*/128);
//   data::DataLoader loader(corpus.inputs, corpus.targets, {.batch_size = 32});
//   ...  // logits: (B, seq_len, kVocabSize)
//   Tensor loss = nn::functional::cross_entropy(logits.view({-1, data::kVocabSize}), batch->targets.view({-1}),
//                                               {.ignore_index = data::kPad});
//
// Tokens: the bytes 0..255 of the text, plus BOS = 256, EOS = 257 and PAD = 258 (vocabulary 259). No
// decoding: UTF-8 text becomes its bytes.
//
// Records: each file is split at lines that hold only "%" (the fortune(6) format; a trailing "\r" is
// allowed). One trailing newline ("\n" or "\r\n") is removed from every record: the one before a "%" line
// belongs to the separator. A file without such lines is one record. Empty records are skipped.
// Record r becomes the sequence
//     s = [BOS] bytes(r) [EOS] [PAD ...]
// cut or padded to seq_len + 1 tokens (a record longer than seq_len - 1 bytes loses its tail, EOS included;
// num_truncated counts them), and gives one row of each tensor:
//     inputs[i]  = s[0 : seq_len]      targets[i] = s[1 : seq_len + 1]   (next-token prediction)
// Target positions holding PAD are padding: pass ignore_index = kPad to cross_entropy (layers/loss.h) so
// that they do not count.
//
// Size: the files together may hold at most TextCorpusOptions::max_bytes (256 MiB by default; the fortunes
// file is 24 KB). A regular file is checked by its size before it is read; a stream (a FIFO,
// /dev/zero) is read up to the limit and then refused, so an endless one fails instead of growing forever.
//
// Errors (dpe::Error): a file that cannot be opened or read, or is a directory (naming it, and how to install
// the default corpus), more than max_bytes of text (naming the file and the sizes), running out of memory
// (naming the file and the bytes read), seq_len < 1, no paths, fewer than TextCorpusOptions::min_records
// records in all the files (at least 1; naming each file, what it held and the separator rule).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dpe::data {

inline constexpr int64_t kBos = 256;
inline constexpr int64_t kEos = 257;
inline constexpr int64_t kPad = 258;
inline constexpr int64_t kVocabSize = 259;
// Installed by Debian's `fortunes-min` (tools/setup.sh).
inline constexpr const char* kFortunesPath = "/usr/share/games/fortunes/fortunes";

struct TextCorpus {
  Tensor inputs;   // (N, seq_len) int64 on cpu:0, tokens in [0, kVocabSize)
  Tensor targets;  // (N, seq_len) int64 on cpu:0, inputs shifted left by one; kPad where there is no text
  int64_t num_truncated = 0;  // records that did not fit in seq_len + 1 tokens
  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }
};

inline constexpr int64_t kMaxTextCorpusBytes = int64_t{256} << 20;

struct TextCorpusOptions {
  int64_t max_bytes = kMaxTextCorpusBytes;  // the most text all the files together may hold
  // The fewest records all the files together must hold (>= 1): 2 for a corpus that is split into a training
  // and a test part. Fewer is an error naming each file (its size and its "%" lines), the count, this number
  // and the separator rule.
  int64_t min_records = 1;
};

// Reads every file in `paths` (in order, records in file order). seq_len >= 1.
TextCorpus load_text_corpus(const std::vector<std::string>& paths, int64_t seq_len,
                            const TextCorpusOptions& options = {});

// The records of `text` (the splitting rule above), exposed for tests and tools.
std::vector<std::string> split_records(const std::string& text);

// Tokens back to text: bytes as characters, BOS/EOS/PAD as "<bos>", "<eos>", "<pad>" (for printing samples).
std::string decode_tokens(const std::vector<int64_t>& tokens);

}  // namespace dpe::data
