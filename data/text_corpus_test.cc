#include "data/text_corpus.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "data/test_files.h"
#include "tests/testing/errors.h"

namespace dpe::data {
namespace {

using dpe::testing::error_of;
using testing::test_dir;
using Tokens = std::vector<int64_t>;

std::string write_text(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

Tokens row(const Tensor& t, int64_t i) { return t.select(0, i).to_vector<int64_t>(); }

constexpr int64_t B = kBos, E = kEos, P = kPad;

TEST(TextCorpus, SplitRecords) {
  EXPECT_EQ(split_records("ab\n%\ncd\nef\n%\ng\n"), (std::vector<std::string>{"ab", "cd\nef", "g"}));
  EXPECT_EQ(split_records("no separator\nat all\n"), (std::vector<std::string>{"no separator\nat all"}));
  EXPECT_EQ(split_records("x\r\n%\r\ny"), (std::vector<std::string>{"x", "y"}));  // CRLF, no final newline
  EXPECT_EQ(split_records("%\n\n%\n%\na\n%\n"), (std::vector<std::string>{"a"}));       // empty records skipped
  // A lone "\r" at the end is text, not a newline (it was dropped: found reading the code for fuzz/).
  EXPECT_EQ(split_records("a\r"), (std::vector<std::string>{"a\r"}));
  EXPECT_EQ(split_records("a\r\n%\nb\r"), (std::vector<std::string>{"a", "b\r"}));
  EXPECT_EQ(split_records("a\r\r\n"), (std::vector<std::string>{"a\r"}));
  EXPECT_EQ(split_records("100%\n%%\n% \n"), (std::vector<std::string>{"100%\n%%\n% "}));  // only a lone "%"
  EXPECT_EQ(split_records("  \n%\nb"), (std::vector<std::string>{"  ", "b"}));
  EXPECT_TRUE(split_records("").empty());
}

TEST(TextCorpus, SequencesInputsAndShiftedTargets) {
  const std::string dir = test_dir();
  // Records "ab", "hello", "x"; seq_len 5, so each sequence has 6 tokens.
  const std::string path = write_text(dir, "f.txt", "ab\n%\nhello\n%\nx\n");
  TextCorpus c = load_text_corpus({path}, 5);
  ASSERT_EQ(c.size(), 3);
  EXPECT_EQ(c.inputs.shape(), (Shape{3, 5}));
  EXPECT_EQ(c.targets.shape(), (Shape{3, 5}));
  EXPECT_EQ(c.inputs.dtype(), DType::Int64);
  EXPECT_EQ(c.targets.dtype(), DType::Int64);
  EXPECT_EQ(c.inputs.device(), Device::cpu(0));

  // "ab": [B a b E P P]
  EXPECT_EQ(row(c.inputs, 0), (Tokens{B, 'a', 'b', E, P}));
  EXPECT_EQ(row(c.targets, 0), (Tokens{'a', 'b', E, P, P}));
  // "hello" (5 bytes, seq_len - 1 = 4 fit with EOS): [B h e l l] o -- cut, EOS lost
  EXPECT_EQ(row(c.inputs, 1), (Tokens{B, 'h', 'e', 'l', 'l'}));
  EXPECT_EQ(row(c.targets, 1), (Tokens{'h', 'e', 'l', 'l', 'o'}));
  // "x": [B x E P P P]
  EXPECT_EQ(row(c.inputs, 2), (Tokens{B, 'x', E, P, P}));
  EXPECT_EQ(row(c.targets, 2), (Tokens{'x', E, P, P, P}));
  EXPECT_EQ(c.num_truncated, 1);
}

TEST(TextCorpus, ExactFitKeepsEos) {
  const std::string dir = test_dir();
  // 4 bytes + BOS + EOS = 6 = seq_len + 1: fits exactly; EOS is the last target.
  TextCorpus c = load_text_corpus({write_text(dir, "f", "abcd")}, 5);
  EXPECT_EQ(row(c.inputs, 0), (Tokens{B, 'a', 'b', 'c', 'd'}));
  EXPECT_EQ(row(c.targets, 0), (Tokens{'a', 'b', 'c', 'd', E}));
  EXPECT_EQ(c.num_truncated, 0);
  // One byte more: EOS no longer fits.
  TextCorpus d = load_text_corpus({write_text(dir, "g", "abcde")}, 5);
  EXPECT_EQ(row(d.targets, 0), (Tokens{'a', 'b', 'c', 'd', 'e'}));
  EXPECT_EQ(d.num_truncated, 1);
}

TEST(TextCorpus, BytesAboveAsciiAndSeveralFiles) {
  const std::string dir = test_dir();
  const std::string a = write_text(dir, "a", "\xc3\xa9");  // "é" in UTF-8: two bytes
  const std::string b = write_text(dir, "b", "z\n%\nq");
  TextCorpus c = load_text_corpus({a, b}, 4);
  ASSERT_EQ(c.size(), 3);
  EXPECT_EQ(row(c.inputs, 0), (Tokens{B, 0xc3, 0xa9, E}));
  EXPECT_EQ(row(c.inputs, 1), (Tokens{B, 'z', E, P}));
  EXPECT_EQ(row(c.inputs, 2), (Tokens{B, 'q', E, P}));
  // Every token is in the vocabulary.
  for (int64_t t : c.inputs.to_vector<int64_t>()) EXPECT_TRUE(t >= 0 && t < kVocabSize) << t;
}

TEST(TextCorpus, SeqLenOne) {
  const std::string dir = test_dir();
  TextCorpus c = load_text_corpus({write_text(dir, "f", "hi")}, 1);
  EXPECT_EQ(row(c.inputs, 0), (Tokens{B}));
  EXPECT_EQ(row(c.targets, 0), (Tokens{'h'}));
}

TEST(TextCorpus, DecodeTokens) {
  EXPECT_EQ(decode_tokens({B, 'h', 'i', E, P}), "<bos>hi<eos><pad>");
  EXPECT_NE(error_of([] { decode_tokens({259}); }).find("token 259 is out of range"), std::string::npos);
}

TEST(TextCorpus, Errors) {
  const std::string dir = test_dir();
  const std::string missing = dir + "/missing.txt";
  EXPECT_TRUE(error_of([&] { load_text_corpus({missing}, 8); })
                  .starts_with("cannot open " + missing + ": No such file or directory; the default corpus "
                               "/usr/share/games/fortunes/fortunes comes with `apt-get install fortunes-min`"))
      << error_of([&] { load_text_corpus({missing}, 8); });
  EXPECT_NE(error_of([&] { load_text_corpus({dir}, 8); }).find("cannot read " + dir + ": Is a directory"),
            std::string::npos);
  const std::string empty = write_text(dir, "empty", "%\n%\n");
  EXPECT_NE(error_of([&] { load_text_corpus({empty}, 8); }).find("no records in " + empty),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_text_corpus({empty}, 0); }).find("seq_len 0 is invalid"), std::string::npos);
  EXPECT_NE(error_of([&] { load_text_corpus({}, 8); }).find("no files given"), std::string::npos);
}

// Regression: a multi-line file without "%" lines is one record, and was refused
// as "the text corpus has 1 records", naming neither the file nor the rule. The message names the file, what
// it held, the count, what was expected and the separator rule.
TEST(TextCorpus, TooFewRecordsNameTheFilesAndTheSeparatorRule) {
  const std::string dir = test_dir();
  const std::string prose = write_text(dir, "prose.txt", "line one\nline two\nline three\n");
  EXPECT_EQ(load_text_corpus({prose}, 8).size(), 1);  // one record is a corpus (min_records = 1)
  std::string e = error_of([&] { load_text_corpus({prose}, 8, {.min_records = 2}); });
  EXPECT_NE(e.find("load_text_corpus: 1 record in " + prose + " (29 bytes, no line holding only \"%\"); expected "
                   "at least 2 records: records are separated by lines holding only \"%\" (the fortune(6) format), "
                   "so a file without such lines is one record, and empty records are skipped"),
            std::string::npos)
      << e;
  // Several files: each with its own count.
  const std::string two = write_text(dir, "two.txt", "a\n%\nb\n");
  const std::string none = write_text(dir, "none.txt", "");
  e = error_of([&] { load_text_corpus({two, none, prose}, 8, {.min_records = 4}); });
  EXPECT_NE(e.find("load_text_corpus: 3 records in 3 files (" + two + ": 2 records, 6 bytes, 1 line holding only "
                   "\"%\"; " + none + ": 0 records, empty; " + prose + ": 1 record, 29 bytes, no line holding only "
                   "\"%\"); expected at least 4 records: records are separated by lines"),
            std::string::npos)
      << e;
  EXPECT_EQ(load_text_corpus({two, none, prose}, 8, {.min_records = 3}).size(), 3);
  // No records at all says the rule too.
  const std::string separators = write_text(dir, "separators.txt", "%\n%\n");
  e = error_of([&] { load_text_corpus({separators}, 8); });
  EXPECT_NE(e.find("load_text_corpus: no records in " + separators + " (4 bytes, 2 lines holding only \"%\"); "
                   "expected at least 1 record: records are separated by lines holding only \"%\""),
            std::string::npos)
      << e;
  EXPECT_NE(error_of([&] { load_text_corpus({prose}, 8, {.min_records = 0}); })
                .find("min_records 0 is invalid; expected min_records >= 1"),
            std::string::npos);
}

// The corpus the tiny-llama example trains on (Debian's fortunes-min, installed by tools/setup.sh): fails,
// never skips, when it is missing.
// An endless stream (/dev/zero) is read up to the limit and refused; it once grew until memory ran out.
// Regular files are refused by their size before they are read; the limit counts all the files together.
TEST(TextCorpus, SizeLimit) {
  const std::string dir = test_dir();
  std::string e = error_of([] { load_text_corpus({"/dev/zero"}, 8, {.max_bytes = 1 << 20}); });
  EXPECT_NE(e.find("load_text_corpus: /dev/zero holds more than 1048576 bytes (the limit, "
                   "TextCorpusOptions::max_bytes)"),
            std::string::npos)
      << e;
  // After other files, the message says how much of the limit they took.
  const std::string small = write_text(dir, "small", std::string(1000, 's'));
  e = error_of([&] { load_text_corpus({small, "/dev/zero"}, 8, {.max_bytes = 1 << 20}); });
  EXPECT_NE(e.find("/dev/zero holds more than 1047576 bytes (the limit, 1048576 bytes less the 1000 bytes of the "
                   "files before it, TextCorpusOptions::max_bytes)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("an endless stream such as /dev/zero"), std::string::npos) << e;
  const std::string a = write_text(dir, "a", std::string(600, 'a'));
  const std::string b = write_text(dir, "b", std::string(500, 'b'));
  e = error_of([&] { load_text_corpus({a, b}, 8, {.max_bytes = 1000}); });
  EXPECT_NE(e.find("load_text_corpus: " + b + " holds 500 bytes; with the 600 bytes of the files before it that is "
                   "more than the limit of 1000 bytes"),
            std::string::npos)
      << e;
  EXPECT_EQ(load_text_corpus({a, b}, 8, {.max_bytes = 1100}).size(), 2);  // exactly the limit is allowed
  EXPECT_NE(error_of([&] { load_text_corpus({a}, 8, {.max_bytes = -1}); }).find("max_bytes -1 is negative"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_text_corpus({"/dev/null"}, 8); }).find("no records in /dev/null"), std::string::npos);
}

// The default limit (256 MiB) ends an endless stream too.
TEST(TextCorpus, DefaultLimitEndsAnEndlessStream) {
  const std::string e = error_of([] { load_text_corpus({"/dev/zero"}, 8); });
  EXPECT_NE(e.find("/dev/zero holds more than 268435456 bytes"), std::string::npos) << e;
}

TEST(TextCorpus, Fortunes) {
  TextCorpus c = load_text_corpus({kFortunesPath}, 128);
  EXPECT_GT(c.size(), 300);
  EXPECT_EQ(c.inputs.shape(), (Shape{c.size(), 128}));
  EXPECT_EQ(row(c.inputs, 0)[0], kBos);
  // The first fortune, as Debian ships it.
  const Tokens first = row(c.targets, 0);
  const std::string text = decode_tokens(Tokens(first.begin(), first.begin() + 41));
  EXPECT_EQ(text, "A day for firm decisions!!!!!  Or is it?<eos>");
}

}  // namespace
}  // namespace dpe::data
