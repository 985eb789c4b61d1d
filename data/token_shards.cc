#include "data/token_shards.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "io/file_kind.h"
#include "io/atomic_file.h"

namespace dpe::data {
namespace {

// The file is little-endian whatever the host: bytes are composed explicitly (compilers turn this into one load).
int32_t load_le32(const uint8_t* p) {
  return static_cast<int32_t>(uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) |
                              (uint32_t{p[3]} << 24));
}
uint32_t load_le16(const uint8_t* p) { return uint32_t{p[0]} | (uint32_t{p[1]} << 8); }

void put_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Closes a descriptor on every path out of a scope.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// ---- writing ----

void write_all(int fd, const std::string& tmp, const uint8_t* data, size_t n, int64_t* written) {
  size_t done = 0;
  const int err = io::write_fully(fd, data, n, &done);
  DPE_CHECK(err == 0, "write_token_shard: writing ", tmp, " failed at byte ", *written + static_cast<int64_t>(done),
            ": ", std::strerror(err));
  *written += static_cast<int64_t>(done);
}

// header + tokens (little-endian, `width` bytes each) to fd, in blocks of at most 1 MiB.
void write_shard_bytes(int fd, const std::string& tmp, const std::vector<uint32_t>& tokens, int version) {
  std::vector<uint8_t> header(kTokenShardHeaderBytes, 0);
  put_le32(header.data(), static_cast<uint32_t>(version == 1 ? kTokenShardMagicV1 : kTokenShardMagicV7));
  put_le32(header.data() + 4, static_cast<uint32_t>(version));
  put_le32(header.data() + 8, static_cast<uint32_t>(tokens.size()));
  int64_t written = 0;
  write_all(fd, tmp, header.data(), header.size(), &written);
  const size_t width = version == 1 ? 2 : 4;
  constexpr size_t kBlockTokens = size_t{1} << 18;
  std::vector<uint8_t> block;
  for (size_t begin = 0; begin < tokens.size(); begin += kBlockTokens) {
    const size_t end = std::min(tokens.size(), begin + kBlockTokens);
    block.assign((end - begin) * width, 0);
    for (size_t i = begin; i < end; ++i) {
      uint8_t* p = block.data() + (i - begin) * width;
      for (size_t b = 0; b < width; ++b) p[b] = static_cast<uint8_t>(tokens[i] >> (8 * b));
    }
    write_all(fd, tmp, block.data(), block.size(), &written);
  }
}

// ---- reading ----

// The header's fields, checked against each other and the file size (file_bytes >= the 1024-byte header).
struct Header {
  int version = 0;
  int64_t count = 0;
};

Header check_header(const std::string& path, const uint8_t* map, int64_t file_bytes) {
  const int32_t magic = load_le32(map);
  const int32_t version = load_le32(map + 4);
  const int32_t count = load_le32(map + 8);
  DPE_CHECK(magic == kTokenShardMagicV1 || magic == kTokenShardMagicV7, path, ": bad magic number ", magic,
            " at byte 0; expected ", kTokenShardMagicV1, " (version 1, uint16 tokens) or ", kTokenShardMagicV7,
            " (version 7, uint32 tokens): not an llm.c token shard");
  const int expected_version = magic == kTokenShardMagicV1 ? 1 : 7;
  if (version != expected_version) {
    const bool known = version == 1 || version == 7;
    DPE_CHECK(false, path, ": ", known ? "version " : "unknown version ", version, " at byte 4",
              known ? dpe::detail::str_cat(" does not go with magic ", magic, " at byte 0") : std::string(),
              "; expected version ", expected_version, " for magic ", magic, " (",
              expected_version == 1 ? "uint16" : "uint32", " tokens)");
  }
  DPE_CHECK(count >= 0, path, ": token count ", count, " at byte 8 is negative; expected a count >= 0");
  const int64_t width = expected_version == 1 ? 2 : 4;
  const int64_t payload = file_bytes - kTokenShardHeaderBytes;
  const int64_t want = int64_t{count} * width;
  DPE_CHECK(want <= payload, path, ": the header's token count ", count, " at byte 8 needs ", want, " bytes (",
            count, " tokens of ", width, " bytes from byte ", kTokenShardHeaderBytes, " to byte ",
            kTokenShardHeaderBytes + want, ") but the file is ", file_bytes, " bytes (", payload,
            " after the header, ", payload / width, " tokens): truncated shard");
  DPE_CHECK(want == payload, path, ": trailing data at byte ", kTokenShardHeaderBytes + want, ": the ", count,
            " tokens of ", width, " bytes end there but the file is ", file_bytes, " bytes (", payload - want,
            payload - want == 1 ? " more byte" : " more bytes", "); expected the file to end after the tokens");
  return {expected_version, count};
}

}  // namespace

void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens, int64_t vocab_size) {
  DPE_CHECK(vocab_size >= 1 && vocab_size <= (int64_t{1} << 32), "write_token_shard: vocab_size ", vocab_size,
            " is invalid; expected 1 <= vocab_size <= 2^32 (uint32 tokens)");
  DPE_CHECK(static_cast<int64_t>(tokens.size()) <= kMaxShardTokens, "write_token_shard: ", tokens.size(),
            " tokens for ", path, " are more than a shard holds (", kMaxShardTokens,
            ", header[2] is an int32); expected them split into several shards");
  for (size_t i = 0; i < tokens.size(); ++i) {
    DPE_CHECK(int64_t{tokens[i]} < vocab_size, "write_token_shard: token ", tokens[i], " at index ", i, " for ",
              path, " is out of range; expected a token in [0, ", vocab_size, ") (vocab_size)");
  }
  struct stat st;
  DPE_CHECK(!(::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)), "write_token_shard: ", path,
            " is a directory; expected a file path");
  const int version = vocab_size <= 65536 ? 1 : 7;

  io::write_file_atomically(path, "write_token_shard",
                            [&](int fd, const std::string& tmp) { write_shard_bytes(fd, tmp, tokens, version); });
}

TokenShard TokenShard::open(const std::string& path, int64_t vocab_size) {
  DPE_CHECK(vocab_size >= 0, "TokenShard::open: vocab_size ", vocab_size, " for ", path,
            " is negative; expected 0 (no check) or the vocabulary size");
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is then refused by the fstat of this very
  // descriptor (no window between a check and the open).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    DPE_CHECK(false, "cannot open ", path, ": ", std::strerror(err), "; expected an llm.c token shard");
  }
  FdCloser closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    DPE_CHECK(false, "cannot read ", path, ": ", std::strerror(err));
  }
  DPE_CHECK(S_ISREG(st.st_mode), "cannot read ", path, ": it is ", io::file_kind(st.st_mode),
            ", not a regular file; expected an llm.c token shard");
  const int64_t file_bytes = static_cast<int64_t>(st.st_size);
  DPE_CHECK(file_bytes >= kTokenShardHeaderBytes, path, ": the file ends at byte ", file_bytes, ", inside the ",
            kTokenShardHeaderBytes, "-byte header (256 little-endian int32); expected an llm.c token shard");

  void* map = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    const int err = errno;
    DPE_CHECK_WITH(err == ENOMEM ? ErrorKind::OutOfMemory : ErrorKind::InvalidArgument, false, "cannot map ",
                   path, " (", file_bytes, " bytes): ", std::strerror(err));
  }
  TokenShard shard;  // owns the mapping from here: an error below unmaps it
  shard.path_ = path;
  shard.map_ = static_cast<const uint8_t*>(map);
  shard.map_bytes_ = file_bytes;
  const Header header = check_header(path, shard.map_, file_bytes);
  shard.version_ = header.version;
  shard.size_ = header.count;
  if (vocab_size > 0) {
    for (int64_t i = 0; i < shard.size_; ++i) {
      const uint32_t t = shard.load(i);
      if (int64_t{t} >= vocab_size) [[unlikely]] {
        DPE_CHECK(false, path, ": token ", t, " at index ", i, " (byte ", kTokenShardHeaderBytes + i * shard.width(),
                  ") is out of range; expected a token in [0, ", vocab_size, ") (vocab_size)");
      }
    }
  }
  return shard;
}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      size_(std::exchange(other.size_, 0)),
      version_(std::exchange(other.version_, 0)) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), static_cast<size_t>(map_bytes_));
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    size_ = std::exchange(other.size_, 0);
    version_ = std::exchange(other.version_, 0);
  }
  return *this;
}

TokenShard::~TokenShard() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), static_cast<size_t>(map_bytes_));
}

uint32_t TokenShard::load(int64_t i) const {
  const uint8_t* p = map_ + kTokenShardHeaderBytes + i * width();
  return version_ == 1 ? load_le16(p) : static_cast<uint32_t>(load_le32(p));
}

uint32_t TokenShard::operator[](int64_t i) const {
  DPE_CHECK(i >= 0 && i < size_, path_, ": token index ", i, " is out of range; expected 0 <= index < ", size_);
  return load(i);
}

void TokenShard::read(int64_t offset, int64_t count, int64_t* out) const {
  DPE_CHECK(offset >= 0 && count >= 0 && offset <= size_ && count <= size_ - offset, path_, ": reading ", count,
            " tokens from index ", offset, " is out of range; expected 0 <= offset, 0 <= count and offset + count <= ",
            size_, " (the shard's tokens)");
  // out: (count) int64  <-  tokens [offset, offset + count), uint16 or uint32 little-endian
  const uint8_t* p = map_ + kTokenShardHeaderBytes + offset * width();
  if (version_ == 1) {
    for (int64_t k = 0; k < count; ++k) out[k] = load_le16(p + 2 * k);
  } else {
    for (int64_t k = 0; k < count; ++k) out[k] = static_cast<uint32_t>(load_le32(p + 4 * k));
  }
}

std::vector<std::string> list_shards(const std::string& dir, const std::string& split) {
  DPE_CHECK(!split.empty() && split.find('/') == std::string::npos, "list_shards: split '", split,
            "' is invalid; expected a non-empty name without '/' (\"train\", \"val\")");
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    const int err = errno;
    DPE_CHECK(false, "list_shards: cannot read the directory ", dir, ": ", std::strerror(err));
  }
  const std::string infix = "_" + split + "_";
  std::vector<std::string> names;
  int64_t entries = 0;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    ++entries;
    // `*_<split>_*.bin`: the infix may not overlap the ".bin" suffix.
    if (name.size() < infix.size() + 4 || !name.ends_with(".bin")) continue;
    const std::string stem = name.substr(0, name.size() - 4);
    if (stem.find(infix) != std::string::npos) names.push_back(name);
  }
  const int err = errno;
  ::closedir(d);
  DPE_CHECK(err == 0, "list_shards: reading the directory ", dir, " failed: ", std::strerror(err));
  DPE_CHECK(!names.empty(), "list_shards: no file named *", infix, "*.bin in ", dir, " (", entries,
            " entries); expected llm.c shards such as fineweb", infix, "000000.bin");
  std::sort(names.begin(), names.end());
  std::vector<std::string> paths;
  paths.reserve(names.size());
  const std::string prefix = dir.ends_with('/') ? dir : dir + "/";
  for (const std::string& name : names) paths.push_back(prefix + name);
  return paths;
}

}  // namespace dpe::data
