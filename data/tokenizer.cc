#include "data/tokenizer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>
#include <unordered_map>
#include <utility>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "core/error.h"
#include "io/atomic_file.h"

namespace dpe::data {

namespace {

namespace spm = ::sentencepiece;

// "a.txt", or "3 files (a.txt, b.txt, c.txt)", or "43 files (a, b, ... z)": what messages call the inputs.
std::string describe_files(const std::vector<std::string>& files) {
  if (files.size() == 1) return files[0];
  std::string text = dpe::detail::str_cat(files.size(), " files (");
  for (size_t i = 0; i < files.size(); ++i) {
    if (files.size() > 4 && i == 2) {
      text += ", ...";
      i = files.size() - 1;
    }
    text += (i == 0 ? "" : ", ") + files[i];
  }
  return text + ")";
}

// The lines of the input files, in order, as SentencePiece's training sentences: a line ends at "\n" or
// "\r\n"; empty lines and lines longer than max_line_bytes are skipped (the latter counted). SentencePiece
// calls these from its own code, so nothing here throws: a failure to open or read a file (or running out of
// memory) ends the iteration with status() an error, and error() says what failed in dpe's words.
class LineIterator final : public spm::SentenceIterator {
 public:
  LineIterator(const std::vector<std::string>& files, int64_t max_line_bytes)
      : files_(files), max_line_bytes_(max_line_bytes) {
    advance();
  }
  ~LineIterator() override {
    close_file();
    std::free(buffer_);
  }
  LineIterator(const LineIterator&) = delete;
  LineIterator& operator=(const LineIterator&) = delete;

  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  spm::util::Status status() const override {
    return error_.empty() ? spm::util::Status() : spm::util::Status(spm::util::StatusCode::kInternal, error_);
  }

  const std::string& error() const { return error_; }
  const TokenizerTrainStats& stats() const { return stats_; }

 private:
  void close_file() {
    if (file_ != nullptr) std::fclose(file_);
    file_ = nullptr;
  }

  void fail(const std::string& message) {
    error_ = message;
    done_ = true;
    close_file();
  }

  // Opens the next file; false when there is none (or it failed: error_ is set).
  bool open_next() {
    if (next_file_ >= files_.size()) return false;
    const std::string& path = files_[next_file_++];
    file_ = std::fopen(path.c_str(), "re");
    if (file_ == nullptr) {
      fail(dpe::detail::str_cat_or_empty("cannot open ", path, ": ", std::strerror(errno)));
      return false;
    }
    path_ = &path;
    ++stats_.files;
    return true;
  }

  void advance() {
    if (done_) return;
    for (;;) {
      if (file_ == nullptr && !open_next()) {
        done_ = true;
        return;
      }
      errno = 0;
      const ssize_t got = ::getline(&buffer_, &capacity_, file_);
      if (got < 0) {
        if (std::ferror(file_)) {
          const int err = errno;
          // getline reports running out of memory for a long line as ENOMEM.
          fail(dpe::detail::str_cat_or_empty("cannot read ", *path_, ": ", std::strerror(err != 0 ? err : EIO)));
          return;
        }
        close_file();
        continue;
      }
      stats_.bytes += got;
      size_t size = static_cast<size_t>(got);
      if (size > 0 && buffer_[size - 1] == '\n') --size;
      if (size > 0 && buffer_[size - 1] == '\r' && size < static_cast<size_t>(got)) --size;
      if (size == 0) continue;
      if (static_cast<int64_t>(size) > max_line_bytes_) {
        ++stats_.long_lines;
        continue;
      }
      try {
        line_.assign(buffer_, size);
      } catch (const std::bad_alloc&) {
        fail(dpe::detail::str_cat_or_empty("out of memory reading ", *path_));
        return;
      }
      ++stats_.lines;
      return;
    }
  }

  const std::vector<std::string>& files_;
  const int64_t max_line_bytes_;
  size_t next_file_ = 0;
  const std::string* path_ = nullptr;
  std::FILE* file_ = nullptr;
  char* buffer_ = nullptr;
  size_t capacity_ = 0;
  std::string line_;
  bool done_ = false;
  std::string error_;
  TokenizerTrainStats stats_;
};

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

// Writes `bytes` through io::write_file_atomically (Note [Files of a model]).
void write_file_atomically(const std::string& path, const std::string& bytes, const char* what) {
  io::write_file_atomically(path, detail::str_cat("Tokenizer::train: the ", what, " ", path),
                            [&](int fd, const std::string& tmp) {
                              size_t written = 0;
                              const int err = io::write_fully(fd, bytes.data(), bytes.size(), &written);
                              DPE_CHECK(err == 0, "Tokenizer::train: cannot write the ", what, " ", path, " (", tmp,
                                        "): ", std::strerror(err));
                            });
}

std::string status_text(const spm::util::Status& status) { return status.ToString(); }

}  // namespace

const char* tokenizer_model_type_name(TokenizerModelType type) {
  switch (type) {
    case TokenizerModelType::Bpe:
      return "bpe";
    case TokenizerModelType::Unigram:
      return "unigram";
  }
  DPE_INTERNAL_ASSERT(false, "unknown TokenizerModelType ", static_cast<int>(type));
  return "";
}

std::string Tokenizer::model_file(const std::string& model_prefix_or_path) {
  return model_prefix_or_path.ends_with(".model") ? model_prefix_or_path : model_prefix_or_path + ".model";
}

std::string Tokenizer::vocab_file(const std::string& model_prefix_or_path) {
  const std::string& p = model_prefix_or_path;
  return p.ends_with(".model") ? p.substr(0, p.size() - 6) + ".vocab" : p + ".vocab";
}

Tokenizer Tokenizer::train(const std::vector<std::string>& input_files, int64_t vocab_size,
                           const std::string& model_prefix_or_path, const TokenizerTrainOptions& options,
                           TokenizerTrainStats* stats) {
  DPE_CHECK(!input_files.empty(), "Tokenizer::train: no input files; expected at least one text file");
  DPE_CHECK(vocab_size >= kMinVocabSize && vocab_size <= kMaxVocabSize, "Tokenizer::train: vocab_size ", vocab_size,
            " is out of range; expected an integer in [", kMinVocabSize, ", ", kMaxVocabSize,
            "] (4 special pieces, 256 byte pieces and at least one character)");
  DPE_CHECK(options.max_lines > 100, "Tokenizer::train: max_lines ", options.max_lines,
            " is too small; expected more than 100 (SentencePiece's smallest sample)");
  DPE_CHECK(options.max_line_bytes >= 10 && options.max_line_bytes <= (int64_t{1} << 30),
            "Tokenizer::train: max_line_bytes ", options.max_line_bytes, " is out of range; expected [10, 2^30]");
  DPE_CHECK(options.num_threads >= 1 && options.num_threads <= 128, "Tokenizer::train: num_threads ",
            options.num_threads, " is out of range; expected [1, 128]");
  DPE_CHECK(options.character_coverage > 0 && options.character_coverage <= 1, "Tokenizer::train: character_coverage ",
            options.character_coverage, " is out of range; expected (0, 1]");
  DPE_CHECK(!model_prefix_or_path.empty(), "Tokenizer::train: the model path is empty; expected a path or prefix");
  const std::string model_path = model_file(model_prefix_or_path), vocab_path = vocab_file(model_prefix_or_path);
  // The directory is checked before training, which may take hours; the writes below report what still fails.
  const std::string dir = directory_of(model_path);
  struct stat st {};
  DPE_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "Tokenizer::train: cannot write the model ",
            model_path, ": ", dir, " is not a directory");
  DPE_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "Tokenizer::train: cannot write the model ", model_path,
            ": the directory ", dir, " is not writable");

  // The trainer's options, as a map: no path or user text is parsed by SentencePiece's flag-string parser.
  // The lines come from `lines`, and the model comes back in memory, so neither "input" nor "model_prefix"
  // is set. "minloglevel" 2 keeps SentencePiece's progress log off stderr; its failures come back as a Status.
  const std::unordered_map<std::string, std::string> spec = {
      {"model_type", tokenizer_model_type_name(options.model_type)},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"unk_id", std::to_string(kUnkId)},
      {"bos_id", std::to_string(kBosId)},
      {"eos_id", std::to_string(kEosId)},
      {"pad_id", std::to_string(kPadId)},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"character_coverage", std::to_string(options.character_coverage)},
      {"input_sentence_size", std::to_string(options.max_lines)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", std::to_string(options.max_line_bytes)},
      {"num_threads", std::to_string(options.num_threads)},
      {"minloglevel", "2"},
  };
  LineIterator lines(input_files, options.max_line_bytes);
  std::string serialized;
  const spm::util::Status status = spm::SentencePieceTrainer::Train(spec, &lines, &serialized);
  if (stats != nullptr) *stats = lines.stats();
  DPE_CHECK(lines.error().empty(), "Tokenizer::train: ", lines.error());
  DPE_CHECK(lines.stats().lines > 0, "Tokenizer::train: ", describe_files(input_files), " hold",
            input_files.size() == 1 ? "s" : "", " no text (", lines.stats().bytes, " bytes",
            lines.stats().long_lines > 0
                ? dpe::detail::str_cat(", ", lines.stats().long_lines, " lines longer than ", options.max_line_bytes,
                                       " bytes")
                : std::string(),
            "); expected at least one non-empty line");
  DPE_CHECK(status.ok(), "Tokenizer::train: SentencePiece could not train a ", vocab_size, "-piece ",
            tokenizer_model_type_name(options.model_type), " model on ", describe_files(input_files), ": ",
            status_text(status));

  auto processor = std::make_unique<spm::SentencePieceProcessor>();
  const spm::util::Status loaded = processor->LoadFromSerializedProto(serialized);
  DPE_CHECK(loaded.ok(), "Tokenizer::train: SentencePiece cannot load the model it trained for ", model_path, ": ",
            status_text(loaded));
  Tokenizer tokenizer(std::move(processor), model_path);
  DPE_INTERNAL_ASSERT(tokenizer.vocab_size() == vocab_size && tokenizer.bos_id() == kBosId &&
                          tokenizer.eos_id() == kEosId && tokenizer.pad_id() == kPadId,
                      "SentencePiece trained a model of ", tokenizer.vocab_size(), " pieces, BOS ", tokenizer.bos_id(),
                      ", EOS ", tokenizer.eos_id(), ", PAD ", tokenizer.pad_id(), "; asked for ", vocab_size);

  // SentencePiece's .vocab format: "piece<TAB>score", one line per id.
  std::ostringstream vocab;
  for (int id = 0; id < static_cast<int>(vocab_size); ++id) {
    vocab << tokenizer.processor_->IdToPiece(id) << '\t' << tokenizer.processor_->GetScore(id) << '\n';
  }
  write_file_atomically(model_path, serialized, "model");
  write_file_atomically(vocab_path, vocab.str(), "vocabulary");
  return tokenizer;
}

Tokenizer Tokenizer::load(const std::string& model_path) {
  struct stat st {};
  DPE_CHECK(!model_path.empty(), "Tokenizer::load: the model path is empty; expected a SentencePiece .model file");
  if (::stat(model_path.c_str(), &st) != 0) {
    DPE_CHECK(false, "Tokenizer::load: cannot open ", model_path, ": ", std::strerror(errno),
              "; expected a SentencePiece .model file (dpe tokenize writes DIR/tokenizer.model)");
  }
  DPE_CHECK(S_ISREG(st.st_mode), "Tokenizer::load: ", model_path,
            " is not a regular file; expected a SentencePiece .model file");
  auto processor = std::make_unique<spm::SentencePieceProcessor>();
  const spm::util::Status status = processor->Load(model_path);
  DPE_CHECK(status.ok(), "Tokenizer::load: ", model_path, " is not a SentencePiece model: ", status_text(status));
  return Tokenizer(std::move(processor), model_path);
}

Tokenizer::Tokenizer(std::unique_ptr<spm::SentencePieceProcessor> processor, std::string model_path)
    : processor_(std::move(processor)), model_path_(std::move(model_path)) {
  vocab_size_ = processor_->GetPieceSize();
  const int bos = processor_->bos_id(), eos = processor_->eos_id(), pad = processor_->pad_id();
  DPE_CHECK(bos >= 0 && eos >= 0 && pad >= 0, "Tokenizer: the model ", model_path_, " has BOS ", bos, ", EOS ", eos,
            ", PAD ", pad, " (-1: none); expected all three (Tokenizer::train makes BOS 1, EOS 2, PAD 3)");
  DPE_CHECK(bos != eos && bos != pad && eos != pad, "Tokenizer: the model ", model_path_, " has BOS ", bos, ", EOS ",
            eos, ", PAD ", pad, "; expected three distinct ids");
  for (int byte = 0; byte < 256; ++byte) {
    char piece[8];
    std::snprintf(piece, sizeof piece, "<0x%02X>", byte);
    DPE_CHECK(processor_->IsByte(processor_->PieceToId(piece)), "Tokenizer: the model ", model_path_,
              " has no byte piece ", piece, "; expected a model trained with byte fallback (Tokenizer::train's), "
              "which spells any text");
  }
  bos_id_ = static_cast<uint32_t>(bos);
  eos_id_ = static_cast<uint32_t>(eos);
  pad_id_ = static_cast<uint32_t>(pad);
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const spm::util::Status status = processor_->Encode(text, &ids);
  DPE_CHECK(status.ok(), "Tokenizer::encode (model ", model_path_, ") failed on ", text.size(), " bytes of text: ",
            status_text(status));
  return std::vector<uint32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::vector<int> in(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    DPE_CHECK(ids[i] < static_cast<uint64_t>(vocab_size_), "Tokenizer::decode: id ", ids[i], " at index ", i,
              " is out of range; expected ids in [0, ", vocab_size_, ") (model ", model_path_, ")");
    in[i] = static_cast<int>(ids[i]);
  }
  std::string text;
  const spm::util::Status status = processor_->Decode(in, &text);
  DPE_CHECK(status.ok(), "Tokenizer::decode (model ", model_path_, ") failed on ", ids.size(), " ids: ",
            status_text(status));
  return text;
}

}  // namespace dpe::data
