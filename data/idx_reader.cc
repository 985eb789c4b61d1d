#include "data/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace dpe::data {
namespace {

// More than any real IDX file; a header claiming more is corrupt (and would overflow size arithmetic).
constexpr int64_t kMaxPayloadBytes = int64_t{1} << 40;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string describe_magic(uint32_t magic) {
  if ((magic >> 16) != 0) return "not an IDX file";
  const uint32_t type = (magic >> 8) & 0xff;
  std::string type_name = type == 0x08 ? "unsigned bytes" : "element type " + hex32(type).substr(8);
  return detail::str_cat(type_name, ", ", magic & 0xff, " dimension", (magic & 0xff) == 1 ? "" : "s");
}

// An open gzip (or plain) file; closes on destruction.
class GzFile {
 public:
  GzFile(const std::string& path, const std::string& open_hint) : path_(path) {
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      const int err = errno;
      DPE_CHECK(false, "cannot open ", path, ": ", err != 0 ? std::strerror(err) : "out of memory",
                open_hint.empty() ? "" : "; ", open_hint);
    }
  }
  ~GzFile() { gzclose_r(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to n bytes into dst; returns fewer only at the end of the data. Throws on a read error or a
  // damaged gzip stream (bad CRC, invalid deflate data, truncated stream).
  size_t read(void* dst, size_t n) {
    auto* out = static_cast<uint8_t*>(dst);
    size_t got = 0;
    while (got < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - got, INT_MAX / 2));
      const int r = gzread(file_, out + got, chunk);
      check_stream(r < 0);
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    return got;
  }

  const std::string& path() const { return path_; }

 private:
  // Throws when zlib reports an error. Z_BUF_ERROR at the end of the input means the gzip stream ended
  // early (zlib returns the bytes it could decompress and flags the truncation).
  void check_stream(bool read_failed) {
    int errnum = Z_OK;
    const char* message = gzerror(file_, &errnum);
    if (errnum == Z_OK && !read_failed) return;
    if (errnum == Z_ERRNO) {
      DPE_CHECK(false, path_, ": read error: ", std::strerror(errno));
    }
    DPE_CHECK(errnum != Z_BUF_ERROR, path_, ": the gzip stream is truncated (", message, ")");
    DPE_CHECK(false, path_, ": corrupt gzip data (", message, ")");
  }

  std::string path_;
  gzFile file_;
};

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

IdxArray read_idx(const std::string& path, uint32_t expected_magic, const IdxReadOptions& options) {
  DPE_CHECK((expected_magic >> 8) == 0x08, "read_idx: expected magic ", expected_magic, " (",
            hex32(expected_magic), ") is not an IDX magic number for unsigned bytes (0x000008DD)");
  GzFile file(path, options.open_hint);

  // ---- header: magic, then one big-endian uint32 size per dimension ----
  uint8_t word[4];
  size_t got = file.read(word, 4);
  DPE_CHECK(got == 4, path, ": the file is too short for an IDX header (", got, " bytes)");
  const uint32_t magic = load_be32(word);
  DPE_CHECK(magic == expected_magic, path, ": bad magic number ", magic, " (", hex32(magic), ", ",
            describe_magic(magic), "); expected ", expected_magic, " (", hex32(expected_magic), ", ",
            describe_magic(expected_magic), ")");
  const int ndims = static_cast<int>(magic & 0xff);
  DPE_CHECK(ndims >= 1, path, ": an IDX file with 0 dimensions has no items");

  IdxArray result;
  for (int d = 0; d < ndims; ++d) {
    got = file.read(word, 4);
    DPE_CHECK(got == 4, path, ": the header ends early: size ", d, " of ", ndims, " is missing");
    result.dims.push_back(load_be32(word));
  }
  // Sizes are uint32, so each fits; their product may not.
  int64_t row_bytes = 1;  // bytes per item along dimension 0
  int64_t total_bytes = result.dims[0];
  for (int d = 1; d < ndims; ++d) {
    const int64_t size = result.dims[d];
    DPE_CHECK(size == 0 || total_bytes <= kMaxPayloadBytes / size, path, ": sizes ", dims_str(result.dims),
              " describe more than ", kMaxPayloadBytes, " bytes; the header is corrupt");
    row_bytes *= size;
    total_bytes *= size;
  }
  result.file_items = result.dims[0];

  // ---- payload: exactly file_items * row_bytes bytes (or the first max_items items) ----
  const bool limited = options.max_items >= 0 && options.max_items < result.file_items;
  const int64_t items = limited ? options.max_items : result.file_items;
  const int64_t want = items * row_bytes;
  result.dims[0] = items;
  // Grown as the data arrives, so that a corrupt header claiming terabytes fails as a short payload, not as
  // an allocation failure.
  constexpr int64_t kChunk = int64_t{1} << 24;
  int64_t have = 0;
  while (have < want) {
    const int64_t chunk = std::min(want - have, kChunk);
    result.data.resize(static_cast<size_t>(have + chunk));
    const int64_t r = static_cast<int64_t>(file.read(result.data.data() + have, static_cast<size_t>(chunk)));
    have += r;
    if (r < chunk) break;
  }
  DPE_CHECK(have == want, path, ": truncated payload: the header promises ", result.file_items, " items of ",
            row_bytes, " bytes (", total_bytes, " bytes) but the file holds only ", have, " bytes after the ",
            4 + 4 * ndims, "-byte header");
  if (limited) return result;

  // Nothing may follow the payload. Reading to the end also makes zlib check the gzip CRC and length.
  int64_t trailing = 0;
  uint8_t sink[4096];
  for (size_t r; (r = file.read(sink, sizeof sink)) > 0;) trailing += static_cast<int64_t>(r);
  DPE_CHECK(trailing == 0, path, ": ", trailing, " unexpected trailing bytes after the payload of ",
            total_bytes, " bytes (", result.file_items, " items of ", row_bytes, " bytes)");
  return result;
}

}  // namespace dpe::data
