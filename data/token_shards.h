// Token shards: llm.c's file format for tokenized text (karpathy/llm.c dev/data/data_common.py), read
// memory-mapped and written atomically.
//
//   data::write_token_shard(dir + "/fineweb_train_000001.bin", tokens, /*vocab_size=*/50257);
//   for (const std::string& path : data::list_shards(dir, "train")) {
//     data::TokenShard shard = data::TokenShard::open(path, /*vocab_size=*/50257);
//     std::vector<int64_t> window(1025);
//     shard.read(/*offset=*/0, 1025, window.data());          // int64: what Embedding takes
//   }
//
// Format: a header of 256 little-endian int32 (1024 bytes), then the tokens, little-endian, and nothing after
// them:
//   header[0] magic   20240520 (kTokenShardMagicV1)  or  20240801 (kTokenShardMagicV7)
//   header[1] version 1: uint16 tokens (GPT-2)       or  7: uint32 tokens (Llama 3; a vocabulary past 65,536)
//   header[2] the number of tokens, >= 0
//   header[3..255] unused (llm.c writes zeros; not read)
// Token i lies at byte 1024 + i * width (width 2 or 4).
//
// Validation (TokenShard::open), every failure a dpe::Error naming the file and the byte offset of what is
// wrong: the path is a regular file (a directory, FIFO, device or socket is refused by what it is; a FIFO is
// opened with O_NONBLOCK, so the open never waits for a writer); it holds the 1024-byte header; the magic is
// one of the two; the version is the magic's own; the count is >= 0 and its tokens fit in the file (naming
// both sizes); nothing follows them; and, with vocab_size > 0, every token is < vocab_size (one linear pass
// over the mapping at open, naming the first bad token's index and offset). Nothing is checked later.
//
// The mapping is read-only and private: a shard must not be truncated while it is open (reading a page that
// is no longer in the file raises SIGBUS, as with any mmap reader). write_token_shard renames a complete new
// file over the path, so rewriting a shard never changes an open one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpe::data {

inline constexpr int32_t kTokenShardMagicV1 = 20240520;  // version 1, uint16 tokens
inline constexpr int32_t kTokenShardMagicV7 = 20240801;  // version 7, uint32 tokens
inline constexpr int64_t kTokenShardHeaderInts = 256;
inline constexpr int64_t kTokenShardHeaderBytes = kTokenShardHeaderInts * 4;
// header[2] is an int32: no shard holds more tokens.
inline constexpr int64_t kMaxShardTokens = INT32_MAX;

// Writes `tokens` to `path` as a shard: version 1 (uint16) when vocab_size <= 65536, else version 7 (uint32).
// Atomic: the bytes go to a new temporary `<path>.tmp.XXXXXX` beside it, which is fsynced and renamed over
// `path` (a reader sees the old file or the new one, never a part; io/temp_file.h removes the temporary on
// SIGINT/SIGTERM/SIGHUP). Throws dpe::Error, before creating anything, when vocab_size is outside
// [1, 2^32], a token is >= vocab_size (naming its index and value), there are more than kMaxShardTokens
// tokens, or `path` is a directory; and when a write, the fsync or the rename fails (naming the temporary).
void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens, int64_t vocab_size);

// A validated shard, memory-mapped read-only. Movable, not copyable; a moved-from shard has size() 0.
// Const methods may be called from any number of threads at once.
class TokenShard {
 public:
  // vocab_size 0: no token check; > 0: every token must be < vocab_size. See the file comment for the checks.
  static TokenShard open(const std::string& path, int64_t vocab_size = 0);

  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  ~TokenShard();

  int64_t size() const { return size_; }      // tokens
  int version() const { return version_; }    // 1 or 7
  int width() const { return version_ == 1 ? 2 : 4; }  // bytes per token
  const std::string& path() const { return path_; }

  // Token i, 0 <= i < size() (checked).
  uint32_t operator[](int64_t i) const;
  // out[k] = token offset + k for k < count; 0 <= offset, 0 <= count, offset + count <= size() (checked, once).
  void read(int64_t offset, int64_t count, int64_t* out) const;

 private:
  TokenShard() = default;
  uint32_t load(int64_t i) const;  // unchecked

  std::string path_;
  const uint8_t* map_ = nullptr;  // the whole file
  int64_t map_bytes_ = 0;
  int64_t size_ = 0;
  int version_ = 0;
};

// The files of `dir` named `*_<split>_*.bin` (llm.c's naming: fineweb_train_000001.bin, fineweb_val_000000.bin),
// as `dir + "/" + name`, sorted by name. Throws dpe::Error naming the directory when it cannot be read or holds
// no such file, and when split is empty or holds a '/'.
std::vector<std::string> list_shards(const std::string& dir, const std::string& split);

}  // namespace dpe::data
