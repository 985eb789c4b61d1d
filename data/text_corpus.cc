#include "data/text_corpus.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string_view>

#include "core/error.h"

namespace dpe::data {
namespace {

std::string read_file(const std::string& path) {
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    DPE_CHECK(false, "cannot open ", path, ": ", err != 0 ? std::strerror(err) : "unknown error",
              "; the default corpus ", kFortunesPath, " comes with `apt-get install fortunes-min`");
  }
  std::string text;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, got);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  DPE_CHECK(!failed, "cannot read ", path, ": ", std::strerror(err));  // e.g. a directory
  return text;
}

void add_record(std::string record, std::vector<std::string>& records) {
  if (record.ends_with('\n')) record.pop_back();
  if (record.ends_with('\r')) record.pop_back();
  if (!record.empty()) records.push_back(std::move(record));
}

}  // namespace

std::vector<std::string> split_records(const std::string& text) {
  std::vector<std::string> records;
  std::string current;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t newline = text.find('\n', pos);
    const size_t next = newline == std::string::npos ? text.size() : newline + 1;  // past this line
    std::string_view line(text.data() + pos, (newline == std::string::npos ? text.size() : newline) - pos);
    if (line == "%" || line == "%\r") {
      add_record(std::move(current), records);
      current.clear();
    } else {
      current.append(text, pos, next - pos);  // the line with its newline
    }
    pos = next;
  }
  add_record(std::move(current), records);
  return records;
}

TextCorpus load_text_corpus(const std::vector<std::string>& paths, int64_t seq_len) {
  DPE_CHECK(seq_len >= 1, "load_text_corpus: seq_len ", seq_len, " is invalid; expected seq_len >= 1");
  DPE_CHECK(!paths.empty(), "load_text_corpus: no files given");
  std::vector<std::string> records;
  for (const std::string& path : paths) {
    std::vector<std::string> file_records = split_records(read_file(path));
    std::move(file_records.begin(), file_records.end(), std::back_inserter(records));
  }
  std::string names;
  for (const std::string& path : paths) names += (names.empty() ? "" : ", ") + path;
  DPE_CHECK(!records.empty(), "load_text_corpus: no records in ", names, " (every file is empty)");

  // sequence: (seq_len + 1) = [BOS] bytes [EOS] [PAD ...], cut to length
  // inputs: (N, seq_len) = sequence[0 : seq_len]   targets: (N, seq_len) = sequence[1 : seq_len + 1]
  const int64_t n = static_cast<int64_t>(records.size());
  TextCorpus corpus;
  corpus.inputs = Tensor::empty({n, seq_len}, DType::Int64);
  corpus.targets = Tensor::empty({n, seq_len}, DType::Int64);
  int64_t* x = corpus.inputs.data<int64_t>();
  int64_t* y = corpus.targets.data<int64_t>();
  std::vector<int64_t> sequence(seq_len + 1);
  for (int64_t i = 0; i < n; ++i) {
    const std::string& record = records[i];
    std::fill(sequence.begin(), sequence.end(), kPad);
    sequence[0] = kBos;
    const int64_t bytes = std::min<int64_t>(static_cast<int64_t>(record.size()), seq_len);
    for (int64_t j = 0; j < bytes; ++j) sequence[1 + j] = static_cast<unsigned char>(record[j]);
    if (1 + bytes <= seq_len) {
      sequence[1 + bytes] = kEos;
    }
    if (static_cast<int64_t>(record.size()) + 2 > seq_len + 1) ++corpus.num_truncated;
    std::copy(sequence.begin(), sequence.end() - 1, x + i * seq_len);
    std::copy(sequence.begin() + 1, sequence.end(), y + i * seq_len);
  }
  return corpus;
}

std::string decode_tokens(const std::vector<int64_t>& tokens) {
  std::string text;
  for (int64_t t : tokens) {
    if (t >= 0 && t < 256) {
      text.push_back(static_cast<char>(t));
    } else if (t == kBos) {
      text += "<bos>";
    } else if (t == kEos) {
      text += "<eos>";
    } else if (t == kPad) {
      text += "<pad>";
    } else {
      DPE_CHECK(false, "decode_tokens: token ", t, " is out of range; expected [0, ", kVocabSize, ")");
    }
  }
  return text;
}

}  // namespace dpe::data
