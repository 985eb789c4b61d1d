// Tokenizer: a subword tokenizer for language models, a thin wrapper around SentencePiece (BPE by default,
// or unigram) trained with byte fallback, so that any valid UTF-8 text round trips:
// decode(encode(text)) == text.
//
//   data::Tokenizer tok = data::Tokenizer::train({"corpus.txt"}, /*vocab_size=*/8192, "out/tokenizer.model");
//   std::vector<uint32_t> ids = tok.encode("Hello, wörld");  // no BOS/EOS: the caller adds tok.bos_id() ...
//   std::string text = tok.decode(ids);                      // == "Hello, wörld"
//   data::Tokenizer same = data::Tokenizer::load("out/tokenizer.model");
//
// Ids of a model made by train():
//   0          <unk>   never produced by encode: byte fallback spells every character
//   1          <s>     BOS: dpe tokenize puts it before each document
//   2          </s>    EOS: after each document
//   3          <pad>   PAD: what a loader fills short sequences with (a target to ignore)
//   4..259     <0x00>..<0xFF>: byte fallback, a character outside the vocabulary becomes its UTF-8 bytes
//   260..      the pieces and characters learned from the text (vocab_size - 260 of them)
// so vocab_size is at least kMinVocabSize (261). A model loaded from elsewhere keeps its own ids; load()
// accepts it when it has BOS, EOS and PAD and the 256 byte pieces, and the accessors report its ids.
//
// Text is not normalized (SentencePiece's "identity" rule, no dummy prefix, whitespace kept as it is), so
// spaces, tabs and newlines round trip. Two exceptions, both SentencePiece's: U+2581 (▁, its space mark)
// decodes as a space, and bytes that are not valid UTF-8 are encoded as U+FFFD (the replacement character).
// decode() drops BOS, EOS and PAD (control pieces have no text).
//
// Training reads every line of the input files (a line ends at "\n" or "\r\n"; empty lines are skipped) as
// one SentencePiece sentence; lines longer than TokenizerTrainOptions::max_line_bytes are left out of
// training (encode() still takes them). No path or user text reaches SentencePiece's option parser: the
// trainer gets its options as a map and the lines through a SentenceIterator, and the model it returns in
// memory is written by this file (Note [Files of a model]).
//
// Reproducibility: training is deterministic. SentencePiece's BPE trainer draws no random numbers (its
// merges break ties by frequency, length, then text), and the sample it keeps when the files hold more than
// max_lines lines is drawn with SentencePiece's own fixed seed; so SetRandomGeneratorSeed, which only its
// sampling encoders read, is left alone. The thread count is an option with a fixed default rather than the
// machine's core count: the BPE model is the same for any count, unigram's EM sums per thread.
//
// Errors: dpe::Error naming the call and the file, with SentencePiece's own message when it failed
// (util::Status): a vocab_size outside [kMinVocabSize, kMaxVocabSize], too small for the text's characters or
// larger than the text can fill, inputs that cannot be read or hold no text, a model file that is missing or
// not a usable model, an id out of range in decode(). train() sets SentencePiece's process-wide log level
// (errors only); encode() and decode() are const and may run concurrently on one Tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace dpe::data {

enum class TokenizerModelType { Bpe, Unigram };
// "bpe", "unigram": SentencePiece's names.
const char* tokenizer_model_type_name(TokenizerModelType type);

struct TokenizerTrainOptions {
  TokenizerModelType model_type = TokenizerModelType::Bpe;
  // Lines the trainer holds in memory: all of them when the files have fewer, otherwise a sample of this many
  // (SentencePiece's input_sentence_size and shuffle_input_sentence). More than 100 (SentencePiece's minimum).
  int64_t max_lines = 10'000'000;
  // Longer lines (in bytes) are not trained on (SentencePiece's max_sentence_length); at least 10.
  int64_t max_line_bytes = int64_t{1} << 16;
  // The trainer's threads, in [1, 128]: a fixed number, so that a model does not depend on the machine.
  int num_threads = 4;
  // The share of the text's characters that become pieces of their own; the rarest rest is spelled in bytes.
  double character_coverage = 0.9995;
};

// What train() read.
struct TokenizerTrainStats {
  int64_t files = 0;
  int64_t bytes = 0;       // every byte of every file
  int64_t lines = 0;       // non-empty lines given to the trainer (before its sample)
  int64_t long_lines = 0;  // lines left out for being longer than max_line_bytes
};

class Tokenizer {
 public:
  static constexpr uint32_t kUnkId = 0, kBosId = 1, kEosId = 2, kPadId = 3;
  static constexpr uint32_t kFirstByteId = 4;  // <0x00>; <0xFF> is kFirstByteId + 255
  static constexpr int64_t kMinVocabSize = 261;  // the 4 special pieces, 256 bytes, and one character
  static constexpr int64_t kMaxVocabSize = int64_t{1} << 24;

  // Trains a model on the lines of `input_files` and writes it (Note [Files of a model]). `vocab_size` is
  // exact: SentencePiece refuses a size the text cannot fill ("Vocabulary size too high") or whose
  // characters do not fit ("Vocabulary size is smaller than required_chars").
  static Tokenizer train(const std::vector<std::string>& input_files, int64_t vocab_size,
                         const std::string& model_prefix_or_path, const TokenizerTrainOptions& options = {},
                         TokenizerTrainStats* stats = nullptr);
  // A model file written by train() (or by SentencePiece, with BOS, EOS, PAD and byte fallback).
  static Tokenizer load(const std::string& model_path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // The ids of `text`, without BOS or EOS; every id < vocab_size().
  std::vector<uint32_t> encode(std::string_view text) const;
  // The text of `ids`; an id >= vocab_size() is an error naming it and its index.
  std::string decode(const std::vector<uint32_t>& ids) const;

  int64_t vocab_size() const { return vocab_size_; }
  uint32_t bos_id() const { return bos_id_; }
  uint32_t eos_id() const { return eos_id_; }
  uint32_t pad_id() const { return pad_id_; }
  // The model's file, as given to load() or written by train().
  const std::string& model_path() const { return model_path_; }

  // Note [Files of a model]: a path ending in ".model" names the model file, and the vocabulary (one
  // "piece<TAB>score" line per id, SentencePiece's .vocab format) goes beside it with ".vocab" in its place;
  // any other path is a prefix, of "<prefix>.model" and "<prefix>.vocab" (SentencePiece's convention). Each
  // file is written to a temporary in its directory and renamed over the name, so a failed run never leaves
  // half a model. These return the two paths.
  static std::string model_file(const std::string& model_prefix_or_path);
  static std::string vocab_file(const std::string& model_prefix_or_path);

 private:
  Tokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> processor, std::string model_path);

  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::string model_path_;
  int64_t vocab_size_ = 0;
  uint32_t bos_id_ = 0, eos_id_ = 0, pad_id_ = 0;
};

}  // namespace dpe::data
