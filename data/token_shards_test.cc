#include "data/token_shards.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

#include "data/test_files.h"
#include "tests/testing/errors.h"

namespace dpe::data {
namespace {

using dpe::testing::error_of;
using testing::test_dir;
using Bytes = std::vector<uint8_t>;

// The magic numbers' little-endian bytes, worked out by hand: 20240520 = 0x0134D888, 20240801 = 0x0134D9A1.
const Bytes kMagicV1 = {0x88, 0xd8, 0x34, 0x01};
const Bytes kMagicV7 = {0xa1, 0xd9, 0x34, 0x01};

void put_le32(Bytes& out, int64_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(static_cast<uint32_t>(v) >> (8 * i)));
}

// A shard built byte by byte: magic, version, count, 253 zero ints, then `payload` as given.
Bytes shard_bytes(int64_t magic, int64_t version, int64_t count, const Bytes& payload) {
  Bytes out;
  put_le32(out, magic);
  put_le32(out, version);
  put_le32(out, count);
  out.resize(1024, 0);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::string write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return path;
}

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<int64_t> all_tokens(const TokenShard& shard) {
  std::vector<int64_t> out(static_cast<size_t>(shard.size()));
  shard.read(0, shard.size(), out.data());
  return out;
}

// The names in `dir`, sorted.
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(TokenShards, WritesVersion1ByteForByte) {
  const std::string path = test_dir() + "/a.bin";
  write_token_shard(path, {0, 1, 258, 65535}, 65536);  // 65536: the largest vocabulary of uint16 tokens
  const Bytes b = read_bytes(path);
  ASSERT_EQ(b.size(), 1024u + 4 * 2);
  EXPECT_EQ(Bytes(b.begin(), b.begin() + 12), (Bytes{0x88, 0xd8, 0x34, 0x01, 1, 0, 0, 0, 4, 0, 0, 0}));
  EXPECT_EQ(std::count(b.begin() + 12, b.begin() + 1024, 0), 1012);  // header[3..255] = 0, as llm.c writes
  EXPECT_EQ(Bytes(b.begin() + 1024, b.end()), (Bytes{0x00, 0x00, 0x01, 0x00, 0x02, 0x01, 0xff, 0xff}));
}

TEST(TokenShards, WritesVersion7JustAbove65535) {
  const std::string path = test_dir() + "/a.bin";
  write_token_shard(path, {65536, 7}, 65537);  // one past uint16: version 7, 4 bytes per token
  const Bytes b = read_bytes(path);
  ASSERT_EQ(b.size(), 1024u + 2 * 4);
  EXPECT_EQ(Bytes(b.begin(), b.begin() + 12), (Bytes{0xa1, 0xd9, 0x34, 0x01, 7, 0, 0, 0, 2, 0, 0, 0}));
  EXPECT_EQ(Bytes(b.begin() + 1024, b.end()), (Bytes{0x00, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00}));
}

TEST(TokenShards, RoundTripBothVersions) {
  const std::string dir = test_dir();
  write_token_shard(dir + "/v1.bin", {50256, 0, 15496, 11, 995}, 50257);
  const TokenShard v1 = TokenShard::open(dir + "/v1.bin", 50257);
  EXPECT_EQ(v1.version(), 1);
  EXPECT_EQ(v1.width(), 2);
  EXPECT_EQ(v1.size(), 5);
  EXPECT_EQ(v1.path(), dir + "/v1.bin");
  EXPECT_EQ(all_tokens(v1), (std::vector<int64_t>{50256, 0, 15496, 11, 995}));
  EXPECT_EQ(v1[2], 15496u);

  write_token_shard(dir + "/v7.bin", {128000, 65535, 65536, 0, 128255}, 128256);  // Llama 3's vocabulary
  const TokenShard v7 = TokenShard::open(dir + "/v7.bin", 128256);
  EXPECT_EQ(v7.version(), 7);
  EXPECT_EQ(v7.width(), 4);
  EXPECT_EQ(all_tokens(v7), (std::vector<int64_t>{128000, 65535, 65536, 0, 128255}));
  std::vector<int64_t> middle(2);
  v7.read(1, 2, middle.data());
  EXPECT_EQ(middle, (std::vector<int64_t>{65535, 65536}));

  write_token_shard(dir + "/empty.bin", {}, 10);
  EXPECT_EQ(TokenShard::open(dir + "/empty.bin").size(), 0);
  EXPECT_EQ(read_bytes(dir + "/empty.bin").size(), 1024u);
  // Only the three shards: no temporary is left behind.
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"empty.bin", "v1.bin", "v7.bin"}));
}

TEST(TokenShards, ReadsHandMadeShards) {
  const std::string dir = test_dir();
  // Version 1: 0x1234 = 4660, 0xffff = 65535, 0x0100 = 256.
  write_bytes(dir + "/v1.bin", shard_bytes(20240520, 1, 3, {0x34, 0x12, 0xff, 0xff, 0x00, 0x01}));
  const TokenShard v1 = TokenShard::open(dir + "/v1.bin", 65536);
  EXPECT_EQ(v1.version(), 1);
  EXPECT_EQ(all_tokens(v1), (std::vector<int64_t>{4660, 65535, 256}));
  // Version 7: 0x12345678 = 305419896, 0xfffffffe = 4294967294 (no vocabulary check).
  write_bytes(dir + "/v7.bin", shard_bytes(20240801, 7, 2, {0x78, 0x56, 0x34, 0x12, 0xfe, 0xff, 0xff, 0xff}));
  const TokenShard v7 = TokenShard::open(dir + "/v7.bin");
  EXPECT_EQ(v7.version(), 7);
  EXPECT_EQ(all_tokens(v7), (std::vector<int64_t>{305419896, 4294967294}));
  EXPECT_EQ(v7[1], 4294967294u);
  // Unused header ints are not read.
  Bytes junk = shard_bytes(20240520, 1, 1, {5, 0});
  junk[12] = 0xff;
  junk[1023] = 0x7f;
  EXPECT_EQ(all_tokens(TokenShard::open(write_bytes(dir + "/junk.bin", junk))), (std::vector<int64_t>{5}));
}

TEST(TokenShards, MoveOnly) {
  const std::string path = test_dir() + "/a.bin";
  write_token_shard(path, {1, 2, 3}, 4);
  TokenShard a = TokenShard::open(path);
  TokenShard b = std::move(a);
  EXPECT_EQ(a.size(), 0);  // NOLINT(bugprone-use-after-move): the moved-from state is part of the contract
  EXPECT_EQ(b[2], 3u);
  TokenShard c = TokenShard::open(path);
  c = std::move(b);
  EXPECT_EQ(all_tokens(c), (std::vector<int64_t>{1, 2, 3}));
  static_assert(!std::is_copy_constructible_v<TokenShard> && !std::is_copy_assignable_v<TokenShard>);
}

TEST(TokenShards, RewritingKeepsAnOpenShardIntact) {
  const std::string path = test_dir() + "/a.bin";
  write_token_shard(path, {1, 2, 3}, 10);
  const TokenShard old = TokenShard::open(path);
  write_token_shard(path, {9, 8}, 10);  // renamed over the path: the open mapping is of the old file
  EXPECT_EQ(all_tokens(old), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(all_tokens(TokenShard::open(path)), (std::vector<int64_t>{9, 8}));
}

TEST(TokenShards, MalformedShardsNameTheFileAndOffset) {
  const std::string dir = test_dir();
  auto open_error = [&](const std::string& name, const Bytes& bytes, int64_t vocab = 0) {
    const std::string path = write_bytes(dir + "/" + name, bytes);
    const std::string e = error_of([&] { TokenShard::open(path, vocab); });
    EXPECT_TRUE(contains(e, path)) << e;
    return e;
  };
  std::string e = open_error("empty.bin", {});
  EXPECT_TRUE(contains(e, "the file ends at byte 0, inside the 1024-byte header")) << e;
  e = open_error("short.bin", Bytes(1023, 0));
  EXPECT_TRUE(contains(e, "the file ends at byte 1023, inside the 1024-byte header")) << e;

  e = open_error("magic.bin", shard_bytes(12345, 1, 0, {}));
  EXPECT_TRUE(contains(e, "bad magic number 12345 at byte 0; expected 20240520 (version 1, uint16 tokens) or "
                          "20240801 (version 7, uint32 tokens)")) << e;
  // The bytes of the magic in the other byte order (a big-endian writer).
  e = open_error("big_endian.bin", shard_bytes(0x88d83401, 1, 0, {}));
  EXPECT_TRUE(contains(e, "bad magic number -1999096831 at byte 0")) << e;

  e = open_error("v1_as_7.bin", shard_bytes(20240520, 7, 0, {}));
  EXPECT_TRUE(contains(e, "version 7 at byte 4 does not go with magic 20240520 at byte 0; expected version 1")) << e;
  e = open_error("v7_as_1.bin", shard_bytes(20240801, 1, 0, {}));
  EXPECT_TRUE(contains(e, "version 1 at byte 4 does not go with magic 20240801 at byte 0; expected version 7")) << e;
  e = open_error("unknown_version.bin", shard_bytes(20240520, 2, 0, {}));
  EXPECT_TRUE(contains(e, "unknown version 2 at byte 4; expected version 1 for magic 20240520")) << e;

  e = open_error("negative.bin", shard_bytes(20240520, 1, -1, {}));
  EXPECT_TRUE(contains(e, "token count -1 at byte 8 is negative")) << e;
  // 5 uint16 tokens need bytes 1024..1034; the file has 6 bytes (3 tokens) after the header.
  e = open_error("truncated.bin", shard_bytes(20240520, 1, 5, Bytes(6, 0)));
  EXPECT_TRUE(contains(e, "the header's token count 5 at byte 8 needs 10 bytes (5 tokens of 2 bytes from byte 1024 to "
                          "byte 1034) but the file is 1030 bytes (6 after the header, 3 tokens)")) << e;
  e = open_error("truncated7.bin", shard_bytes(20240801, 7, 2, Bytes(7, 0)));
  EXPECT_TRUE(contains(e, "needs 8 bytes (2 tokens of 4 bytes from byte 1024 to byte 1032) but the file is 1031 bytes"))
      << e;
  e = open_error("huge_count.bin", shard_bytes(20240801, 7, 0x7fffffff, {}));
  EXPECT_TRUE(contains(e, "token count 2147483647 at byte 8 needs 8589934588 bytes")) << e;
  // 3 tokens end at byte 1030; one byte more follows.
  e = open_error("trailing.bin", shard_bytes(20240520, 1, 3, Bytes(7, 0)));
  EXPECT_TRUE(contains(e, "trailing data at byte 1030: the 3 tokens of 2 bytes end there but the file is 1031 bytes (1 "
                          "more byte); expected the file to end after the tokens")) << e;
  e = open_error("trailing0.bin", shard_bytes(20240801, 7, 0, Bytes(4, 0)));
  EXPECT_TRUE(contains(e, "trailing data at byte 1024")) << e;

  // Tokens against the vocabulary: index 2 is 300 (0x012c) at byte 1024 + 2 * 2.
  e = open_error("vocab1.bin", shard_bytes(20240520, 1, 3, {1, 0, 2, 0, 0x2c, 0x01}), 256);
  EXPECT_TRUE(contains(e, "token 300 at index 2 (byte 1028) is out of range; expected a token in [0, 256)")) << e;
  // Index 1 is 65536 (0x00010000) at byte 1024 + 1 * 4; vocab 65536 is exactly one too small.
  e = open_error("vocab7.bin", shard_bytes(20240801, 7, 2, {0xff, 0xff, 0, 0, 0, 0, 1, 0}), 65536);
  EXPECT_TRUE(contains(e, "token 65536 at index 1 (byte 1028) is out of range; expected a token in [0, 65536)")) << e;
  // The same file opens without the vocabulary check, and with a vocabulary that holds it.
  EXPECT_EQ(TokenShard::open(dir + "/vocab7.bin").size(), 2);
  EXPECT_EQ(TokenShard::open(dir + "/vocab7.bin", 65537).size(), 2);
}

TEST(TokenShards, RefusesWhatIsNotARegularFileWithoutBlocking) {
  const std::string dir = test_dir();
  std::string e = error_of([&] { TokenShard::open(dir); });
  EXPECT_TRUE(contains(e, "cannot read " + dir + ": it is a directory, not a regular file")) << e;
  const std::string fifo = dir + "/fifo.bin";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  e = error_of([&] { TokenShard::open(fifo); });  // no writer: a blocking open would never return
  EXPECT_TRUE(contains(e, "cannot read " + fifo + ": it is a FIFO (named pipe), not a regular file")) << e;
  e = error_of([&] { TokenShard::open(dir + "/missing.bin"); });
  EXPECT_TRUE(contains(e, "cannot open " + dir + "/missing.bin: No such file or directory")) << e;
  e = error_of([&] { TokenShard::open("/dev/null"); });
  EXPECT_TRUE(contains(e, "cannot read /dev/null: it is a character device")) << e;
}

TEST(TokenShards, CallerErrors) {
  const std::string dir = test_dir();
  write_token_shard(dir + "/a.bin", {1, 2, 3}, 4);
  const TokenShard s = TokenShard::open(dir + "/a.bin");
  std::vector<int64_t> out(4);
  std::string e = error_of([&] { s.read(2, 2, out.data()); });
  EXPECT_TRUE(contains(e, "reading 2 tokens from index 2 is out of range; expected 0 <= offset, 0 <= count and offset "
                          "+ count <= 3")) << e;
  EXPECT_TRUE(contains(error_of([&] { s.read(-1, 1, out.data()); }), "from index -1 is out of range"));
  EXPECT_TRUE(contains(error_of([&] { s.read(0, -1, out.data()); }), "reading -1 tokens"));
  EXPECT_TRUE(contains(error_of([&] { s[3]; }), "token index 3 is out of range; expected 0 <= index < 3"));
  EXPECT_TRUE(contains(error_of([&] { TokenShard::open(dir + "/a.bin", -1); }), "vocab_size -1 for"));

  e = error_of([&] { write_token_shard(dir + "/b.bin", {0, 4, 5}, 5); });
  EXPECT_TRUE(contains(e, "token 5 at index 2 for " + dir + "/b.bin is out of range; expected a token in [0, 5)")) << e;
  e = error_of([&] { write_token_shard(dir + "/b.bin", {}, 0); });
  EXPECT_TRUE(contains(e, "vocab_size 0 is invalid; expected 1 <= vocab_size <= 2^32")) << e;
  e = error_of([&] { write_token_shard(dir + "/b.bin", {}, (int64_t{1} << 32) + 1); });
  EXPECT_TRUE(contains(e, "vocab_size 4294967297 is invalid")) << e;
  e = error_of([&] { write_token_shard(dir, {1}, 5); });
  EXPECT_TRUE(contains(e, dir + " is a directory; expected a file path")) << e;
  e = error_of([&] { write_token_shard(dir + "/no/such/dir.bin", {1}, 5); });
  EXPECT_TRUE(contains(e, "cannot create a temporary file " + dir + "/no/such/dir.bin.tmp.")) << e;
  // Nothing was created by the refused writes.
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"a.bin"}));
}

TEST(TokenShards, ListShardsByLlmcNaming) {
  const std::string dir = test_dir();
  for (const char* name : {"fineweb_train_000002.bin", "fineweb_train_000001.bin", "fineweb_val_000000.bin",
                           "train.bin", "fineweb_train_000003.txt", "fineweb_train_000004.bin.tmp.Ab12Cd",
                           "x_training_1.bin", "_train_.bin"}) {
    write_bytes(dir + "/" + name, {});
  }
  EXPECT_EQ(list_shards(dir, "train"), (std::vector<std::string>{dir + "/_train_.bin", dir + "/fineweb_train_000001.bin",
                                                                  dir + "/fineweb_train_000002.bin"}));
  EXPECT_EQ(list_shards(dir + "/", "val"), (std::vector<std::string>{dir + "/fineweb_val_000000.bin"}));

  std::string e = error_of([&] { list_shards(dir, "test"); });
  EXPECT_TRUE(contains(e, "list_shards: no file named *_test_*.bin in " + dir + " (8 entries)")) << e;
  e = error_of([&] { list_shards(dir + "/missing", "train"); });
  EXPECT_TRUE(contains(e, "cannot read the directory " + dir + "/missing: No such file or directory")) << e;
  EXPECT_TRUE(contains(error_of([&] { list_shards(dir, ""); }), "split '' is invalid"));
  EXPECT_TRUE(contains(error_of([&] { list_shards(dir, "a/b"); }), "split 'a/b' is invalid"));
}

}  // namespace
}  // namespace dpe::data
