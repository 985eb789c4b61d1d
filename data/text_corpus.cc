#include "data/text_corpus.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <new>
#include <string_view>

#include "core/error.h"

namespace dpe::data {
namespace {

// Reads the file at `path`; *total counts the bytes of every file read so far and may not pass max_bytes. A
// regular file is checked by its size before it is read; anything else (a FIFO, /dev/zero) is read up to the
// limit and then refused, so an endless stream ends in an error instead of growing until memory runs out.
std::string read_file(const std::string& path, int64_t max_bytes, int64_t* total) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    DPE_CHECK(false, "cannot open ", path, ": ", std::strerror(err), "; the default corpus ", kFortunesPath,
              " comes with `apt-get install fortunes-min`");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  DPE_CHECK(::fstat(fd, &st) == 0, "cannot read ", path, ": ", std::strerror(errno));
  DPE_CHECK(!S_ISDIR(st.st_mode), "cannot read ", path, ": ", std::strerror(EISDIR));
  const int64_t budget = max_bytes - *total;
  std::string text;
  try {
    if (S_ISREG(st.st_mode)) {
      DPE_CHECK(st.st_size <= budget, "load_text_corpus: ", path, " holds ", static_cast<int64_t>(st.st_size),
                " bytes; with the ", *total, " bytes of the files before it that is more than the limit of ",
                max_bytes, " bytes (TextCorpusOptions::max_bytes)");
      text.reserve(static_cast<size_t>(st.st_size));
    }
    char buf[1 << 16];
    for (;;) {
      const ssize_t got = ::read(fd, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      DPE_CHECK(got >= 0, "cannot read ", path, ": ", std::strerror(errno));
      if (got == 0) break;
      if (got > budget - static_cast<int64_t>(text.size())) {
        DPE_CHECK(false, "load_text_corpus: ", path, " holds more than ", budget, " bytes (the limit, ",
                  *total == 0 ? "" : dpe::detail::str_cat(max_bytes, " bytes less the ", *total,
                                                          " bytes of the files before it, "),
                  "TextCorpusOptions::max_bytes): an endless stream such as /dev/zero or a FIFO?");
      }
      text.append(buf, static_cast<size_t>(got));
    }
  } catch (const std::bad_alloc&) {
    DPE_CHECK_WITH(ErrorKind::OutOfMemory, false, "load_text_corpus: out of memory reading ", path, " after ",
                   text.size(), " bytes");
  }
  *total += static_cast<int64_t>(text.size());
  return text;
}

void add_record(std::string record, std::vector<std::string>& records) {
  if (record.ends_with("\r\n")) {
    record.resize(record.size() - 2);
  } else if (record.ends_with('\n')) {
    record.pop_back();
  }  // a lone "\r" is not a newline: it stays
  if (!record.empty()) records.push_back(std::move(record));
}

// split_records, also counting the separator lines (for the message when there are too few records).
std::vector<std::string> split_counting(const std::string& text, int64_t* separators) {
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
      ++*separators;
    } else {
      current.append(text, pos, next - pos);  // the line with its newline
    }
    pos = next;
  }
  add_record(std::move(current), records);
  return records;
}

// What was read from one file, for the message when there are too few records.
struct FileSummary {
  std::string path;
  int64_t bytes = 0;
  int64_t records = 0;
  int64_t separators = 0;
};

std::string plural(int64_t n, const char* word) {
  return dpe::detail::str_cat(n, " ", word, n == 1 ? "" : "s");
}

// "45 bytes, no line holding only \"%\"" / "empty" / "3 lines holding only \"%\"".
std::string describe(const FileSummary& f) {
  if (f.bytes == 0) return "empty";
  return dpe::detail::str_cat(plural(f.bytes, "byte"), ", ",
                              f.separators == 0 ? std::string("no line") : plural(f.separators, "line"),
                              " holding only \"%\"");
}

}  // namespace

std::vector<std::string> split_records(const std::string& text) {
  int64_t separators = 0;
  return split_counting(text, &separators);
}

namespace {

// Note [Too few records]: a multi-line file without "%" lines is one record (the rule), and was refused by
// the tool as "the text corpus has 1 records", naming neither the file nor the rule. The message names every
// file with what it held, the count, what was expected, and the rule (TextCorpusOptions::min_records).
[[noreturn]] void fail_too_few(const std::vector<FileSummary>& files, int64_t found, int64_t expected) {
  std::string where;
  if (files.size() == 1) {
    where = dpe::detail::str_cat(files[0].path, " (", describe(files[0]), ")");
  } else {
    where = dpe::detail::str_cat(files.size(), " files (");
    for (size_t i = 0; i < files.size(); ++i) {
      where += dpe::detail::str_cat(i ? "; " : "", files[i].path, ": ", plural(files[i].records, "record"), ", ",
                                    describe(files[i]));
    }
    where += ")";
  }
  DPE_CHECK(false, "load_text_corpus: ", found == 0 ? std::string("no records") : plural(found, "record"), " in ",
            where, "; expected at least ", plural(expected, "record"),
            ": records are separated by lines holding only \"%\" (the fortune(6) format), so a file without "
            "such lines is one record, and empty records are skipped");
  __builtin_unreachable();
}

}  // namespace

TextCorpus load_text_corpus(const std::vector<std::string>& paths, int64_t seq_len, const TextCorpusOptions& options) {
  DPE_CHECK(seq_len >= 1, "load_text_corpus: seq_len ", seq_len, " is invalid; expected seq_len >= 1");
  DPE_CHECK(!paths.empty(), "load_text_corpus: no files given");
  DPE_CHECK(options.max_bytes >= 0, "load_text_corpus: max_bytes ", options.max_bytes, " is negative");
  DPE_CHECK(options.min_records >= 1, "load_text_corpus: min_records ", options.min_records,
            " is invalid; expected min_records >= 1");
  std::vector<std::string> records;
  std::vector<FileSummary> files;
  int64_t total = 0;
  for (const std::string& path : paths) {
    std::string text = read_file(path, options.max_bytes, &total);
    FileSummary summary{.path = path, .bytes = static_cast<int64_t>(text.size())};
    try {
      std::vector<std::string> file_records = split_counting(text, &summary.separators);
      summary.records = static_cast<int64_t>(file_records.size());
      std::move(file_records.begin(), file_records.end(), std::back_inserter(records));
      files.push_back(std::move(summary));
    } catch (const std::bad_alloc&) {
      DPE_CHECK_WITH(ErrorKind::OutOfMemory, false, "load_text_corpus: out of memory splitting ", path, " (",
                     text.size(), " bytes) into records");
    }
  }
  if (static_cast<int64_t>(records.size()) < options.min_records) {
    fail_too_few(files, static_cast<int64_t>(records.size()), options.min_records);
  }

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
