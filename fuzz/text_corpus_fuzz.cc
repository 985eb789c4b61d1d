// Fuzz target: the byte-level text corpus reader (data::load_text_corpus, data/text_corpus.h): the user's
// --corpus files of `dpe train --model tiny-llama`. Input: byte 0 picks seq_len (1 + b % 40) and, when
// b >= 200, a max_bytes of 64 (the size limit's path); the rest is the file. Oracles: the tensors hold one row
// per record of split_records, each [BOS] bytes [EOS] [PAD ...] cut to seq_len, targets shifted by one.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/text_corpus.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dpe;
  if (size == 0) return 0;
  static fuzz::InputFile file("text");
  const int64_t seq_len = 1 + data[0] % 40;
  data::TextCorpusOptions options;
  if (data[0] >= 200) options.max_bytes = 64;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  file.write(data + 1, size - 1);

  const std::vector<std::string> records = data::split_records(text);
  for (const std::string& r : records) {
    fuzz::require(!r.empty(), "split_records: empty records are skipped");
  }
  fuzz::expect_only_dpe_errors("load", [&] {
    const data::TextCorpus corpus = data::load_text_corpus({file.path()}, seq_len, options);
    const int64_t n = static_cast<int64_t>(records.size());
    fuzz::require(corpus.size() == n, "one row per record");
    fuzz::require(corpus.inputs.shape() == Shape{n, seq_len} && corpus.targets.shape() == Shape{n, seq_len},
                  "inputs and targets are (records, seq_len)");
    const std::vector<int64_t> x = corpus.inputs.to_vector<int64_t>(), y = corpus.targets.to_vector<int64_t>();
    int64_t truncated = 0;
    for (int64_t i = 0; i < n; ++i) {
      const std::string& r = records[i];
      truncated += static_cast<int64_t>(r.size()) + 2 > seq_len + 1;
      std::vector<int64_t> s(seq_len + 1, data::kPad);  // [BOS] bytes [EOS] [PAD ...], cut to seq_len + 1
      s[0] = data::kBos;
      const int64_t bytes = std::min<int64_t>(static_cast<int64_t>(r.size()), seq_len);
      for (int64_t j = 0; j < bytes; ++j) s[1 + j] = static_cast<unsigned char>(r[j]);
      if (1 + bytes <= seq_len) s[1 + bytes] = data::kEos;
      for (int64_t j = 0; j < seq_len; ++j) {
        fuzz::require(x[i * seq_len + j] == s[j] && y[i * seq_len + j] == s[j + 1], "row = the record's tokens");
      }
    }
    fuzz::require(corpus.num_truncated == truncated, "num_truncated counts the records cut short");
  });
  return 0;
}
