// dpe tokenize: trains a SentencePiece tokenizer on text files (data/tokenizer.h) and writes the text,
// document by document, as llm.c token shards (data/token_shards.h) split into training and validation.
//
// Note [Documents]
// A document is a maximal run of lines of one file none of which is a separator: a blank line (empty, or only
// spaces, tabs, "\r", "\f", "\v") or a line holding only "%" (fortune(6) files' separator; a trailing "\r"
// allowed). So paragraphs of prose and the entries of fortune files are both documents, under one rule; a
// fortune entry that holds a blank line is two documents. A line ends at "\n" or "\r\n"; a document's text is
// its lines joined with "\n", without the last line's newline, and becomes the tokens
//     [BOS] encode(text) [EOS]
// Documents are numbered from 0 across the files in the order given. With k = round(1 / --val-fraction)
// (>= 2), documents 1, 1 + k, 1 + 2k, ... go to validation and the others to training: deterministic, spread
// over the whole text, and at least one document each way whenever there are 2 or more (fewer is an error).
//
// Output, in --out DIR: tokenizer.model and tokenizer.vocab (Tokenizer::train), and the shards
// <name>_train_000000.bin, <name>_train_000001.bin, ... and <name>_val_000000.bin, ...: each split's tokens in
// order, cut every --shard-tokens tokens (a document may continue in the next shard, as in llm.c's
// fineweb.py); version 1 (uint16 tokens) when the vocabulary fits, else 7. DIR is created when it does not
// exist (its parent must); an existing DIR must be empty unless --force, which replaces the tokenizer and
// removes the shards of the same --name (after training, before the first shard is written) and leaves
// every other file alone. Each file is written atomically (a temporary renamed over its name).
//
// Everything that can be refused without reading the text is refused first (options, inputs, DIR); then one
// pass over the inputs counts the documents (fewer than 2 is refused before training); then SentencePiece
// trains; then a second pass encodes and writes, with a progress line. Memory: the training sample
// (--max-train-lines lines) and at most one shard of tokens per split.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "tools/dpe/cli_util.h"
#include "tools/dpe/commands.h"
#include "tools/dpe/file_args.h"
#include "tools/dpe/progress.h"

namespace dpe::tool {

namespace {

using data::Tokenizer;

struct TokenizeArgs {
  std::vector<std::string> inputs;
  int64_t vocab_size = 0;
  std::string out;
  double val_fraction = 0.05;
  std::string model_type = "bpe";
  std::string name = "tokens";
  int64_t shard_tokens = 100'000'000;
  int64_t max_train_lines = 10'000'000;
  bool force = false;
};

constexpr char kModelName[] = "tokenizer.model";
constexpr char kVocabName[] = "tokenizer.vocab";

std::string plural(int64_t n, const char* word) { return dpe::detail::str_cat(n, " ", word, n == 1 ? "" : "s"); }

// "a.txt" or "43 files".
std::string inputs_str(const std::vector<std::string>& inputs) {
  return inputs.size() == 1 ? inputs[0] : plural(static_cast<int64_t>(inputs.size()), "file");
}

std::string parent_of(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

std::string shard_path(const std::string& dir, const std::string& name, const char* split, int64_t index) {
  char number[16];
  std::snprintf(number, sizeof number, "%06lld", static_cast<long long>(index));
  return dir + "/" + name + "_" + split + "_" + number + ".bin";
}

// Whether `file` (a name in DIR) is a shard of `name`: <name>_train_NNNNNN.bin or <name>_val_NNNNNN.bin.
bool is_shard_of(std::string_view file, const std::string& name) {
  for (std::string_view split : {"_train_", "_val_"}) {
    const std::string prefix = name + std::string(split);
    if (!file.starts_with(prefix) || !file.ends_with(".bin")) continue;
    const std::string_view digits = file.substr(prefix.size(), file.size() - prefix.size() - 4);
    if (digits.size() >= 6 && digits.find_first_not_of("0123456789") == std::string_view::npos) return true;
  }
  return false;
}

// The entries of `dir` but "." and "..".
std::vector<std::string> entries_of(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), &::closedir);
  DPE_CHECK(d != nullptr, "--out ", dir, ": cannot list the directory: ", std::strerror(errno));
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  return names;
}

// --out: an existing directory, or a new one in an existing directory (created here); writable, which is
// proved by creating and removing a file (access() says yes to root on a file system that refuses it); and,
// unless --force, empty. Returns whether DIR existed.
bool prepare_out_dir(const TokenizeArgs& args) {
  const std::string& out = args.out;
  struct stat st {};
  bool existed = ::stat(out.c_str(), &st) == 0;
  if (existed) {
    DPE_CHECK(S_ISDIR(st.st_mode), "--out ", out, ": is not a directory; expected a directory for the tokenizer "
              "and the shards");
  } else {
    DPE_CHECK(errno == ENOENT, "--out ", out, ": ", std::strerror(errno));
    const std::string parent = parent_of(out);
    DPE_CHECK(::stat(parent.c_str(), &st) == 0, "--out ", out, ": the directory ", parent,
              " does not exist (create it first)");
    DPE_CHECK(S_ISDIR(st.st_mode), "--out ", out, ": ", parent, " is not a directory");
    if (::mkdir(out.c_str(), 0777) != 0) {
      DPE_CHECK(false, "--out ", out, ": cannot create the directory: ", std::strerror(errno));
    }
  }
  std::string probe = out + "/.dpe_tokenize_probe.XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    const int err = errno;
    if (!existed) ::rmdir(out.c_str());
    DPE_CHECK(false, "--out ", out, ": the directory is not writable (creating a file there failed: ",
              std::strerror(err), ")");
  }
  ::close(fd);
  ::unlink(probe.c_str());
  if (existed && !args.force) {
    const std::vector<std::string> names = entries_of(out);
    DPE_CHECK(names.empty(), "--out ", out, ": the directory is not empty (", plural(static_cast<int64_t>(names.size()),
              "entry"), ", e.g. '", names.empty() ? "" : names[0], "'); give a new or empty directory, or --force "
              "to replace its tokenizer and its '", args.name, "' shards");
  }
  return existed;
}

// With --force, the files a run replaces or removes must not be among its inputs.
void check_inputs_outside_outputs(const TokenizeArgs& args) {
  struct stat out_st {};
  if (::stat(args.out.c_str(), &out_st) != 0) return;
  for (const std::string& input : args.inputs) {
    struct stat dir_st {};
    if (::stat(parent_of(input).c_str(), &dir_st) != 0) continue;
    if (dir_st.st_dev != out_st.st_dev || dir_st.st_ino != out_st.st_ino) continue;
    const std::string file = input.substr(input.rfind('/') == std::string::npos ? 0 : input.rfind('/') + 1);
    DPE_CHECK(file != kModelName && file != kVocabName && !is_shard_of(file, args.name), "--input ", input,
              ": is a file that --out ", args.out, " --force replaces or removes; give another --out or --name");
  }
}

// Every check that needs no text read, in the order a user would fix them.
void check_before_work(TokenizeArgs& args) {
  while (args.out.size() > 1 && args.out.back() == '/') args.out.pop_back();  // "out/" names the same directory
  DPE_CHECK(args.val_fraction <= 0.5, "--val-fraction ", args.val_fraction, ": expected a number in (0, 0.5] "
            "(every k-th document goes to validation, k = round(1 / fraction) >= 2)");
  DPE_CHECK(!args.name.empty() && args.name.size() <= 100 &&
                args.name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") ==
                    std::string::npos &&
                args.name[0] != '.',
            "--name '", args.name, "': expected 1 to 100 letters, digits, '.', '_' or '-', not starting with '.'");
  // data::list_shards finds a split's shards as *_<split>_*.bin: a name holding "_val_" would put training
  // shards in the validation split too.
  const std::string tail = args.name + "_";
  DPE_CHECK(tail.find("_train_") == std::string::npos && tail.find("_val_") == std::string::npos, "--name '",
            args.name, "': the shard names ", args.name, "_train_000000.bin and ", args.name,
            "_val_000000.bin would each match both splits' patterns (*_train_*.bin, *_val_*.bin); choose a name "
            "without '_train' or '_val' before an '_' or its end");
  for (const std::string& input : args.inputs) check_input_file("--input", input);
  std::vector<std::pair<std::string, std::string>> inputs;
  for (const std::string& input : args.inputs) inputs.emplace_back("--input", input);
  check_distinct_files(inputs);
  if (args.force) check_inputs_outside_outputs(args);
  prepare_out_dir(args);
}

// The documents of the input files, in order (Note [Documents]).
class DocumentReader {
 public:
  explicit DocumentReader(const std::vector<std::string>& files) : files_(files) {}
  ~DocumentReader() {
    if (file_ != nullptr) std::fclose(file_);
    std::free(line_);
  }
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // The next document's text in *text; false after the last.
  bool next(std::string* text) {
    text->clear();
    bool in_document = false;
    for (;;) {
      if (file_ == nullptr) {
        if (in_document) return true;  // a document ends with its file
        if (next_file_ == files_.size()) return false;
        path_ = &files_[next_file_++];
        file_ = std::fopen(path_->c_str(), "re");
        DPE_CHECK(file_ != nullptr, "--input ", *path_, ": cannot open: ", std::strerror(errno));
      }
      errno = 0;
      const ssize_t got = ::getline(&line_, &capacity_, file_);
      if (got < 0) {
        const int err = errno;
        DPE_CHECK(!std::ferror(file_), "--input ", *path_, ": cannot read: ", std::strerror(err != 0 ? err : EIO));
        std::fclose(file_);
        file_ = nullptr;
        continue;
      }
      bytes_ += got;
      std::string_view line(line_, static_cast<size_t>(got));
      if (line.ends_with('\n')) line.remove_suffix(line.ends_with("\r\n") ? 2 : 1);
      const bool separator = line.find_first_not_of(" \t\r\f\v") == std::string_view::npos || line == "%" ||
                             line == "%\r";
      if (separator) {
        if (in_document) return true;
        continue;
      }
      if (in_document) text->push_back('\n');
      text->append(line);
      in_document = true;
    }
  }

  int64_t bytes_read() const { return bytes_; }

 private:
  const std::vector<std::string>& files_;
  size_t next_file_ = 0;
  const std::string* path_ = nullptr;
  std::FILE* file_ = nullptr;
  char* line_ = nullptr;
  size_t capacity_ = 0;
  int64_t bytes_ = 0;
};

// One split's tokens, written as shards of at most `cap` tokens.
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string name, const char* split, int64_t cap, int64_t vocab_size)
      : dir_(std::move(dir)), name_(std::move(name)), split_(split), cap_(cap), vocab_size_(vocab_size) {}

  void add(const std::vector<uint32_t>& tokens) {
    size_t from = 0;
    while (from < tokens.size()) {
      const size_t room = static_cast<size_t>(cap_) - buffer_.size();
      const size_t take = std::min(room, tokens.size() - from);
      buffer_.insert(buffer_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(from),
                     tokens.begin() + static_cast<std::ptrdiff_t>(from + take));
      from += take;
      if (static_cast<int64_t>(buffer_.size()) == cap_) flush();
    }
  }
  // Writes what is left (nothing when the last shard was full).
  void finish() {
    if (!buffer_.empty()) flush();
  }

  int64_t tokens() const { return tokens_; }
  int64_t shards() const { return shards_; }
  std::string first_path() const { return shard_path(dir_, name_, split_, 0); }

 private:
  void flush() {
    data::write_token_shard(shard_path(dir_, name_, split_, shards_), buffer_, vocab_size_);
    tokens_ += static_cast<int64_t>(buffer_.size());
    ++shards_;
    buffer_.clear();
  }

  std::string dir_, name_;
  const char* split_;
  int64_t cap_, vocab_size_;
  std::vector<uint32_t> buffer_;
  int64_t tokens_ = 0, shards_ = 0;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void run_tokenize(TokenizeArgs& args) {
  check_before_work(args);
  const int64_t k = static_cast<int64_t>(std::llround(std::min(1.0 / args.val_fraction, 1e15)));

  // Pass 1: count the documents, so that too few is refused before training.
  int64_t documents = 0, total_bytes = 0;
  {
    DocumentReader reader(args.inputs);
    std::string text;
    while (reader.next(&text)) ++documents;
    total_bytes = reader.bytes_read();
  }
  DPE_CHECK(documents >= 2, "--input ", inputs_str(args.inputs), ": ",
            documents == 0 ? std::string("no documents") : plural(documents, "document"), " in ",
            plural(total_bytes, "byte"), "; expected at least 2 (one for training, one for validation): documents "
            "are separated by blank lines or by lines holding only %");

  // Training.
  std::fprintf(stderr, "dpe tokenize: training a %lld-piece %s tokenizer on %s (%lld bytes, %lld documents) "
               "with SentencePiece\n", static_cast<long long>(args.vocab_size), args.model_type.c_str(),
               inputs_str(args.inputs).c_str(), static_cast<long long>(total_bytes),
               static_cast<long long>(documents));
  const auto train_start = std::chrono::steady_clock::now();
  data::TokenizerTrainStats train_stats;
  const Tokenizer tokenizer = Tokenizer::train(
      args.inputs, args.vocab_size, args.out + "/" + kModelName,
      {.model_type = args.model_type == "bpe" ? data::TokenizerModelType::Bpe : data::TokenizerModelType::Unigram,
       .max_lines = args.max_train_lines},
      &train_stats);
  const double train_seconds = seconds_since(train_start);

  // --force: the shards of an earlier run of this name go before the first new one is written, so that the
  // directory never mixes two runs' shards.
  if (args.force) {
    for (const std::string& file : entries_of(args.out)) {
      if (!is_shard_of(file, args.name)) continue;
      const std::string path = args.out + "/" + file;
      DPE_CHECK(::unlink(path.c_str()) == 0, "--out ", args.out, " --force: cannot remove the earlier shard ", path,
                ": ", std::strerror(errno));
    }
  }

  // Pass 2: encode and write.
  ShardWriter train(args.out, args.name, "train", args.shard_tokens, tokenizer.vocab_size());
  ShardWriter val(args.out, args.name, "val", args.shard_tokens, tokenizer.vocab_size());
  int64_t text_tokens = 0, text_bytes = 0, val_documents = 0, produced = 0;
  const auto encode_start = std::chrono::steady_clock::now();
  {
    // Progress's line is a training line: its "loss" is 0 here; the rate is tokens produced per second.
    Progress progress("encode (bytes read)", total_bytes, {.unit = "tokens"});
    DocumentReader reader(args.inputs);
    std::string text;
    std::vector<uint32_t> tokens;
    for (int64_t d = 0; reader.next(&text); ++d) {
      const std::vector<uint32_t> ids = tokenizer.encode(text);
      tokens.clear();
      tokens.push_back(tokenizer.bos_id());
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      tokens.push_back(tokenizer.eos_id());
      const bool validation = d % k == 1;
      (validation ? val : train).add(tokens);
      val_documents += validation;
      text_tokens += static_cast<int64_t>(ids.size());
      text_bytes += static_cast<int64_t>(text.size());
      produced += static_cast<int64_t>(tokens.size());
      progress.update(reader.bytes_read(), 0.0, produced);
    }
    train.finish();
    val.finish();
    progress.update(total_bytes, 0.0, produced);
    progress.finish(dpe::detail::str_cat("done: ", train.tokens() + val.tokens(), " tokens in ",
                                         static_cast<int>(seconds_since(encode_start) * 10) / 10.0, " s"));
  }

  std::printf("dpe tokenize: %lld documents from %s (%lld bytes): %lld train, %lld validation (documents 1, "
              "1+%lld, 1+%lld, ...)\n",
              static_cast<long long>(documents), inputs_str(args.inputs).c_str(), static_cast<long long>(total_bytes),
              static_cast<long long>(documents - val_documents), static_cast<long long>(val_documents),
              static_cast<long long>(k), static_cast<long long>(2 * k));
  std::printf("tokenizer: %s/%s and %s, %s, %lld pieces (BOS %u, EOS %u, PAD %u), trained in %.1f s on %lld lines%s\n",
              args.out.c_str(), kModelName, kVocabName, args.model_type.c_str(),
              static_cast<long long>(tokenizer.vocab_size()), tokenizer.bos_id(), tokenizer.eos_id(),
              tokenizer.pad_id(), train_seconds, static_cast<long long>(train_stats.lines),
              train_stats.long_lines > 0
                  ? dpe::detail::str_cat(" (", train_stats.long_lines, " longer lines left out)").c_str()
                  : "");
  for (const ShardWriter* w : {&train, &val}) {
    std::printf("%-5s %lld tokens in %s: %s%s\n", w == &train ? "train" : "val", static_cast<long long>(w->tokens()),
                plural(w->shards(), "shard").c_str(), w->first_path().c_str(), w->shards() > 1 ? " ..." : "");
  }
  std::printf("tokens per byte of text: %.4f (%.2f bytes per token; BOS and EOS not counted)\n",
              text_bytes > 0 ? static_cast<double>(text_tokens) / static_cast<double>(text_bytes) : 0.0,
              text_tokens > 0 ? static_cast<double>(text_bytes) / static_cast<double>(text_tokens) : 0.0);
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Train a SentencePiece tokenizer (BPE, byte fallback) on text files and write the text as llm.c token "
      "shards, split into training and validation");
  cmd->footer(
      "Documents: a document is a run of lines between separators: blank lines (empty or only whitespace) and "
      "lines holding only % (fortune files). Each becomes [BOS] tokens [EOS] (BOS 1, EOS 2, PAD 3). Documents "
      "1, 1+k, 1+2k, ... (k = round(1 / --val-fraction)) go to validation, the others to training; at least 2 "
      "are needed.\n"
      "Output in --out DIR: tokenizer.model, tokenizer.vocab, <name>_train_000000.bin ..., <name>_val_000000.bin "
      "... (version 1, uint16 tokens, up to 65536 pieces; else version 7, uint32). DIR is created if missing; an "
      "existing DIR must be empty unless --force (which replaces the tokenizer and removes the earlier shards "
      "of --name, leaving other files). docs/DATA.md, \"Tokenizer\".");
  cmd->add_option("--input", args->inputs, "text files (UTF-8), read in this order")->required()->type_name("FILE");
  add_int_option(*cmd, "--vocab-size", args->vocab_size,
                 "pieces in the vocabulary: 260 special and byte pieces, the text's characters and learned pieces",
                 Tokenizer::kMinVocabSize, Tokenizer::kMaxVocabSize)
      ->required()
      ->default_str("");
  add_path_option(*cmd, "--out", args->out, "directory for the tokenizer and the shards")->required();
  add_real_option(*cmd, "--val-fraction", args->val_fraction,
                  "share of the documents for validation: every k-th, k = round(1 / fraction)", 0, true)
      ->type_name("FLOAT:(0, 0.5]");
  cmd->add_option("--model-type", args->model_type, "SentencePiece's model: bpe or unigram")
      ->check(CLI::IsMember({"bpe", "unigram"}));
  cmd->add_option("--name", args->name, "shard name prefix: <name>_train_000000.bin, <name>_val_000000.bin");
  add_int_option(*cmd, "--shard-tokens", args->shard_tokens, "tokens per shard; more tokens go to further shards", 1,
                 data::kMaxShardTokens);
  add_int_option(*cmd, "--max-train-lines", args->max_train_lines,
                 "lines SentencePiece trains on: all when there are fewer, else a sample (its fixed seed)", 101,
                 INT32_MAX);
  cmd->add_flag("--force", args->force, "write into a non-empty --out: replace the tokenizer and the shards of --name");
  cmd->callback([args] { run_tokenize(*args); });
}

}  // namespace dpe::tool
