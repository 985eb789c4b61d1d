#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "data/test_files.h"
#include "tests/testing/errors.h"

namespace dpe::data {
namespace {

using dpe::testing::error_of;
using testing::test_dir;

constexpr auto npos = std::string::npos;

std::string write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Generated English-like text: 9 words a line from a fixed generator, then a number; paragraphs separated by
// blank lines. Its 39 characters (26 letters, "S", ",", ".", 10 digits) and the 260 special and byte pieces
// take 299 ids: a 400-piece vocabulary learns about 100 merged pieces.
std::string generated_text(int lines) {
  static const char* kWords[] = {"the",  "quick", "brown", "fox",   "jumps", "over",  "lazy",   "dog",
                                 "and",  "runs",  "away",  "from",  "a",     "big",   "cat",    "while",
                                 "it",   "is",    "still", "night", "under", "stars", "Sleep,", "then."};
  constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  uint32_t state = 12345;
  std::ostringstream out;
  for (int l = 0; l < lines; ++l) {
    for (int w = 0; w < 9; ++w) {
      state = state * 1103515245u + 12345u;
      out << (w == 0 ? "" : " ") << kWords[(state >> 16) % kNumWords];
    }
    out << " " << l % 97 << (l % 6 == 5 ? "\n\n" : "\n");
  }
  return out.str();
}

class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_dir();
    corpus_ = write_text(dir_ + "/corpus.txt", generated_text(600));
  }
  Tokenizer train(int64_t vocab_size = 400, const TokenizerTrainOptions& options = {}) {
    return Tokenizer::train({corpus_}, vocab_size, dir_ + "/tok.model", options);
  }

  std::string dir_, corpus_;
};

TEST_F(TokenizerTest, TrainWritesTheModelAndItsVocabulary) {
  TokenizerTrainStats stats;
  Tokenizer tok = Tokenizer::train({corpus_}, 400, dir_ + "/tok.model", {}, &stats);
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.model_path(), dir_ + "/tok.model");
  EXPECT_EQ(stats.files, 1);
  EXPECT_EQ(stats.lines, 600);  // the blank lines are not sentences
  EXPECT_EQ(stats.bytes, static_cast<int64_t>(read_bytes(corpus_).size()));
  EXPECT_EQ(stats.long_lines, 0);

  // One "piece<TAB>score" line per id, the special pieces and the bytes first.
  std::istringstream vocab(read_bytes(dir_ + "/tok.vocab"));
  std::vector<std::string> pieces;
  for (std::string line; std::getline(vocab, line);) pieces.push_back(line.substr(0, line.find('\t')));
  ASSERT_EQ(pieces.size(), 400u);
  EXPECT_EQ(pieces[Tokenizer::kUnkId], "<unk>");
  EXPECT_EQ(pieces[Tokenizer::kBosId], "<s>");
  EXPECT_EQ(pieces[Tokenizer::kEosId], "</s>");
  EXPECT_EQ(pieces[Tokenizer::kPadId], "<pad>");
  EXPECT_EQ(pieces[Tokenizer::kFirstByteId], "<0x00>");
  EXPECT_EQ(pieces[Tokenizer::kFirstByteId + 255], "<0xFF>");

  // The file holds the same model: same ids for the same text.
  Tokenizer loaded = Tokenizer::load(dir_ + "/tok.model");
  EXPECT_EQ(loaded.vocab_size(), 400);
  const std::string text = "the lazy dog runs away from a big cat 42";
  EXPECT_EQ(loaded.encode(text), tok.encode(text));
}

TEST_F(TokenizerTest, SpecialIdsAreDistinctAndDecodeDropsThem) {
  Tokenizer tok = train();
  EXPECT_EQ(tok.bos_id(), Tokenizer::kBosId);
  EXPECT_EQ(tok.eos_id(), Tokenizer::kEosId);
  EXPECT_EQ(tok.pad_id(), Tokenizer::kPadId);
  EXPECT_NE(tok.bos_id(), tok.eos_id());
  EXPECT_NE(tok.bos_id(), tok.pad_id());
  EXPECT_NE(tok.eos_id(), tok.pad_id());
  std::vector<uint32_t> ids = {tok.bos_id()};
  for (uint32_t id : tok.encode("the fox")) ids.push_back(id);
  ids.insert(ids.end(), {tok.eos_id(), tok.pad_id(), tok.pad_id()});
  EXPECT_EQ(tok.decode(ids), "the fox");
}

TEST_F(TokenizerTest, AsciiRoundTripsAndLearnedPiecesAreUsed) {
  Tokenizer tok = train();
  for (const std::string text :
       {"the quick brown fox", "", " ", "  two  spaces, a\ttab and\na newline\n", "UPPER CASE and #$%&*+/<=>@[]^_`{|}~",
        "trailing space ", "\n\nleading newlines", "0123456789 1e-3", "\r\nCRLF\r\n"}) {
    const std::vector<uint32_t> ids = tok.encode(text);
    EXPECT_EQ(tok.decode(ids), text) << "ids: " << ids.size();
    for (uint32_t id : ids) {
      EXPECT_LT(id, static_cast<uint64_t>(tok.vocab_size()));
      EXPECT_NE(id, Tokenizer::kUnkId) << text;  // byte fallback spells everything
      EXPECT_NE(id, tok.bos_id());
      EXPECT_NE(id, tok.eos_id());
      EXPECT_NE(id, tok.pad_id());
    }
  }
  // Words of the training text take fewer ids than bytes: merged pieces, not bytes.
  EXPECT_LT(tok.encode("the quick brown fox").size(), std::string("the quick brown fox").size() / 2);
}

TEST_F(TokenizerTest, Utf8OutsideTheTrainingTextRoundTripsThroughBytes) {
  Tokenizer tok = train();
  for (const std::string text : {"café", "naïve résumé", "日本語のテキスト", "Ωμέγα", "emoji 🙂🚀",
                                 "\xF0\x9F\x98\x80 e\xCC\x81", "mixed: the fox 狐 runs"}) {
    const std::vector<uint32_t> ids = tok.encode(text);
    EXPECT_EQ(tok.decode(ids), text);
    bool used_bytes = false;
    for (uint32_t id : ids) {
      EXPECT_LT(id, static_cast<uint64_t>(tok.vocab_size()));
      EXPECT_NE(id, Tokenizer::kUnkId) << text;
      used_bytes |= id >= Tokenizer::kFirstByteId && id < Tokenizer::kFirstByteId + 256;
    }
    EXPECT_TRUE(used_bytes) << text << ": characters the model never saw are spelled as their UTF-8 bytes";
  }
  // "é" (C3 A9) is exactly its two byte pieces.
  EXPECT_EQ(tok.encode("é"), (std::vector<uint32_t>{Tokenizer::kFirstByteId + 0xC3, Tokenizer::kFirstByteId + 0xA9}));
}

TEST_F(TokenizerTest, DocumentedExceptionsToTheRoundTrip) {
  Tokenizer tok = train();
  EXPECT_EQ(tok.decode(tok.encode("a\xE2\x96\x81" "b")), "a b");             // U+2581 is SentencePiece's space
  EXPECT_EQ(tok.decode(tok.encode("bad \xFF byte")), "bad \xEF\xBF\xBD byte");  // invalid UTF-8 -> U+FFFD
}

TEST_F(TokenizerTest, TrainingIsReproducible) {
  train();
  // Again: the same bytes. With another thread count: the same pieces and scores (the model file differs
  // only in the trainer options it records).
  Tokenizer::train({corpus_}, 400, dir_ + "/again.model");
  Tokenizer::train({corpus_}, 400, dir_ + "/threads.model", {.num_threads = 1});
  EXPECT_TRUE(read_bytes(dir_ + "/again.model") == read_bytes(dir_ + "/tok.model"));
  EXPECT_EQ(read_bytes(dir_ + "/again.vocab"), read_bytes(dir_ + "/tok.vocab"));
  EXPECT_EQ(read_bytes(dir_ + "/threads.vocab"), read_bytes(dir_ + "/tok.vocab"));
}

TEST_F(TokenizerTest, UnigramModelsRoundTripToo) {
  // Unigram keeps pieces seen as parts of the text's 24 words: at most 314 here.
  Tokenizer tok = train(310, {.model_type = TokenizerModelType::Unigram});
  EXPECT_EQ(tok.vocab_size(), 310);
  for (const std::string text : {"the quick brown fox", "café 日本", "  x\n"}) {
    EXPECT_EQ(tok.decode(tok.encode(text)), text);
  }
}

TEST_F(TokenizerTest, PathsThatAFlagStringWouldBreakAreTakenAsTheyAre) {
  // SentencePiece's option string splits on spaces and its "input" on commas; neither path goes through it.
  const std::string odd = dir_ + "/a dir, with=odd --chars";
  std::filesystem::create_directory(odd);
  const std::string input = write_text(odd + "/in put,1.txt", read_bytes(corpus_));
  Tokenizer tok = Tokenizer::train({input}, 400, odd + "/m --vocab_size=5");  // a prefix: ".model" is added
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.model_path(), odd + "/m --vocab_size=5.model");
  EXPECT_EQ(Tokenizer::load(odd + "/m --vocab_size=5.model").vocab_size(), 400);
  EXPECT_TRUE(std::filesystem::exists(odd + "/m --vocab_size=5.vocab"));
}

TEST(TokenizerFiles, ModelAndVocabularyNames) {
  EXPECT_EQ(Tokenizer::model_file("out/tokenizer.model"), "out/tokenizer.model");
  EXPECT_EQ(Tokenizer::vocab_file("out/tokenizer.model"), "out/tokenizer.vocab");
  EXPECT_EQ(Tokenizer::model_file("out/tok"), "out/tok.model");
  EXPECT_EQ(Tokenizer::vocab_file("out/tok"), "out/tok.vocab");
}

TEST_F(TokenizerTest, MultipleInputFilesAndLongLines) {
  const std::string second = write_text(dir_ + "/second.txt", "café au lait\r\n" + std::string(100, 'x') + "\n");
  TokenizerTrainStats stats;
  Tokenizer::train({corpus_, second}, 400, dir_ + "/two", {.max_line_bytes = 90}, &stats);  // corpus: <= 56
  EXPECT_EQ(stats.files, 2);
  EXPECT_EQ(stats.lines, 601);
  EXPECT_EQ(stats.long_lines, 1);
}

TEST_F(TokenizerTest, BadVocabularySizesAreClearErrors) {
  EXPECT_NE(error_of([&] { train(0); }).find("Tokenizer::train: vocab_size 0 is out of range; expected an integer "
                                             "in [261, 16777216]"),
            npos);
  EXPECT_NE(error_of([&] { train(-5); }).find("vocab_size -5 is out of range"), npos);
  // 261 pieces cannot hold the text's ~45 characters beside the 260 special and byte pieces.
  const std::string small = error_of([&] { train(261); });
  EXPECT_NE(small.find("Tokenizer::train: SentencePiece could not train a 261-piece bpe model on " + corpus_), npos)
      << small;
  EXPECT_NE(small.find("Vocabulary size is smaller than required_chars"), npos) << small;
  // More pieces than the text has merges.
  const std::string big = error_of([&] { train(100000); });
  EXPECT_NE(big.find("Vocabulary size too high (100000)"), npos) << big;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/tok.model"));  // nothing written on failure
}

TEST_F(TokenizerTest, BadInputsAreClearErrors) {
  const std::string missing = dir_ + "/none.txt";
  EXPECT_NE(error_of([&] { Tokenizer::train({missing}, 300, dir_ + "/m"); })
                .find("Tokenizer::train: cannot open " + missing + ": No such file or directory"),
            npos);
  EXPECT_NE(error_of([&] { Tokenizer::train({dir_}, 300, dir_ + "/m"); })
                .find("cannot read " + dir_ + ": Is a directory"),
            npos);
  const std::string blank = write_text(dir_ + "/blank.txt", "\n\n\r\n");
  EXPECT_NE(error_of([&] { Tokenizer::train({blank}, 300, dir_ + "/m"); })
                .find(blank + " holds no text (4 bytes); expected at least one non-empty line"),
            npos);
  EXPECT_NE(error_of([&] { Tokenizer::train({}, 300, dir_ + "/m"); }).find("no input files"), npos);
  EXPECT_NE(error_of([&] { Tokenizer::train({corpus_}, 300, dir_ + "/no/such/dir/m"); })
                .find("cannot write the model " + dir_ + "/no/such/dir/m.model: " + dir_ +
                      "/no/such/dir is not a directory"),
            npos);
  EXPECT_NE(error_of([&] { train(400, {.max_lines = 100}); }).find("max_lines 100 is too small"), npos);
  EXPECT_NE(error_of([&] { train(400, {.num_threads = 0}); }).find("num_threads 0 is out of range"), npos);
}

TEST_F(TokenizerTest, BadModelPathsAreClearErrors) {
  const std::string missing = dir_ + "/none.model";
  EXPECT_NE(error_of([&] { Tokenizer::load(missing); })
                .find("Tokenizer::load: cannot open " + missing + ": No such file or directory"),
            npos);
  EXPECT_NE(error_of([&] { Tokenizer::load(dir_); }).find("Tokenizer::load: " + dir_ + " is not a regular file"), npos);
  EXPECT_NE(error_of([&] { Tokenizer::load(corpus_); })
                .find("Tokenizer::load: " + corpus_ + " is not a SentencePiece model"),
            npos);
  EXPECT_NE(error_of([&] { Tokenizer::load(""); }).find("the model path is empty"), npos);
}

TEST_F(TokenizerTest, DecodeRefusesIdsOutOfRange) {
  Tokenizer tok = train();
  EXPECT_NE(error_of([&] { tok.decode({5, 6, 400}); })
                .find("Tokenizer::decode: id 400 at index 2 is out of range; expected ids in [0, 400)"),
            npos);
  EXPECT_NE(error_of([&] { tok.decode({4294967295u}); }).find("id 4294967295 at index 0"), npos);
}

}  // namespace
}  // namespace dpe::data
