#include "data/idx_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <new>

#include "core/error.h"
#include "io/file_kind.h"

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

// Deflate's largest expansion: 1032 output bytes per input byte (a stream of one repeated byte). No gzip
// file of n bytes decompresses to more than n * kMaxDeflateRatio bytes.
constexpr int64_t kMaxDeflateRatio = 1032;

// An open gzip (or plain) file; closes on destruction. Opens the descriptor itself so that it knows what the
// path is: a directory, FIFO, device or socket is refused by name, and the size on disk bounds the payload.
// O_NONBLOCK: opening a FIFO must not wait for a writer (it waited forever); it is refused by the fstat of the
// descriptor just opened (no window between a check and the open), and the flag is cleared for the reads.
class GzFile {
 public:
  GzFile(const std::string& path, const std::string& open_hint) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      const int err = errno;
      DPE_CHECK(false, "cannot open ", path, ": ", std::strerror(err), open_hint.empty() ? "" : "; ", open_hint);
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      DPE_CHECK(false, "cannot read ", path, ": ", std::strerror(err));
    }
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      DPE_CHECK(false, "cannot read ", path, ": ", std::strerror(EISDIR), "; expected an IDX file",
                open_hint.empty() ? "" : "; ", open_hint);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      DPE_CHECK(false, "cannot read ", path, ": it is ", io::file_kind(st.st_mode),
                ", not a regular file; expected an IDX file", open_hint.empty() ? "" : "; ", open_hint);
    }
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    file_bytes_ = static_cast<int64_t>(st.st_size);
    errno = 0;
    file_ = gzdopen(fd, "rb");  // on success owns fd (gzclose_r closes it)
    if (file_ == nullptr) {
      ::close(fd);
      DPE_CHECK_WITH(ErrorKind::OutOfMemory, false, "cannot open ", path,
                     ": out of memory (zlib could not allocate its buffers)");
    }
  }
  ~GzFile() { gzclose_r(file_); }

  // The file's size on disk (a regular file's: nothing else is opened).
  int64_t file_bytes() const { return file_bytes_; }
  // Whether the file is plain (not gzip). Valid after the first read.
  bool is_plain() { return gzdirect(file_) == 1; }
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
  gzFile file_ = nullptr;
  int64_t file_bytes_ = -1;
};

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// "28x29".
template <typename It>
std::string sizes_str(It begin, It end) {
  std::string s;
  for (It it = begin; it != end; ++it) s += (it == begin ? "" : "x") + std::to_string(*it);
  return s;
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
  // The items' own sizes against what the caller expects (28x28 images), right after the header: before any
  // payload is read, and before their product (whose overflow is about these sizes too). A file of other
  // images once failed as "truncated", or was read whole, before its sizes were looked at.
  if (!options.item_dims.empty()) {
    DPE_CHECK(options.item_dims.size() == result.dims.size() - 1, "read_idx: item_dims ",
              dims_str(options.item_dims), " has ", options.item_dims.size(), " sizes but ", path, "'s magic ",
              hex32(magic), " has ", ndims - 1, " per item");
    if (!std::equal(options.item_dims.begin(), options.item_dims.end(), result.dims.begin() + 1)) {
      DPE_CHECK(false, path, ": ", options.item_name, " are ", sizes_str(result.dims.begin() + 1, result.dims.end()),
                "; expected ", sizes_str(options.item_dims.begin(), options.item_dims.end()),
                " (the header's sizes are ", dims_str(result.dims), ")");
    }
  }
  // Sizes are uint32, so each fits; their product may not. Both products are bounded, the item's on its own:
  // with dims[0] == 0 the total stays 0 however large an item is.
  int64_t row_bytes = 1;  // bytes per item along dimension 0
  int64_t total_bytes = result.dims[0];
  for (int d = 1; d < ndims; ++d) {
    const int64_t size = result.dims[d];
    DPE_CHECK(size == 0 || (total_bytes <= kMaxPayloadBytes / size && row_bytes <= kMaxPayloadBytes / size), path,
              ": sizes ", dims_str(result.dims), " describe more than ", kMaxPayloadBytes,
              " bytes; the header is corrupt");
    row_bytes *= size;
    total_bytes *= size;
  }
  result.file_items = result.dims[0];

  // ---- payload: exactly file_items * row_bytes bytes (or the first max_items items) ----
  const bool limited = options.max_items >= 0 && options.max_items < result.file_items;
  const int64_t items = limited ? options.max_items : result.file_items;
  const int64_t want = items * row_bytes;
  const int64_t header_bytes = 4 + 4 * int64_t{ndims};
  result.dims[0] = items;
  // Before allocating anything: a regular file cannot hold more than its size (plain) or its size times
  // deflate's largest ratio (gzip). A header claiming more fails here, naming both sizes, without reading.
  if (file.file_bytes() >= 0) {
    const int64_t on_disk = file.file_bytes();
    if (file.is_plain()) {
      const int64_t after_header = std::max<int64_t>(on_disk - header_bytes, 0);
      DPE_CHECK(want <= after_header, path, ": truncated payload: the header promises ", result.file_items,
                " items of ", row_bytes, " bytes (", total_bytes, " bytes) but the file holds only ", after_header,
                " bytes after the ", header_bytes, "-byte header");
    } else {
      const int64_t at_most = on_disk > kMaxPayloadBytes / kMaxDeflateRatio ? kMaxPayloadBytes
                                                                             : on_disk * kMaxDeflateRatio;
      DPE_CHECK(want <= at_most, path, ": truncated payload or corrupt header: the header promises ",
                result.file_items, " items of ", row_bytes, " bytes (", want, " bytes to read) but the ", on_disk,
                "-byte gzip file decompresses to at most ", at_most, " bytes (deflate expands at most ",
                kMaxDeflateRatio, "x)");
    }
  }
  // Grown as the data arrives (a FIFO or device has no size to check against), so that memory follows the
  // data actually read; running out of it is an error naming the sizes.
  constexpr int64_t kChunk = int64_t{1} << 24;
  int64_t have = 0;
  while (have < want) {
    const int64_t chunk = std::min(want - have, kChunk);
    try {
      result.data.resize(static_cast<size_t>(have + chunk));
    } catch (const std::bad_alloc&) {
      DPE_CHECK_WITH(ErrorKind::OutOfMemory, false, path, ": out of memory reading the payload: ", have + chunk,
                     " of the ", want, " bytes the header promises (", items, " items of ", row_bytes, " bytes)");
    }
    const int64_t r = static_cast<int64_t>(file.read(result.data.data() + have, static_cast<size_t>(chunk)));
    have += r;
    if (r < chunk) break;
  }
  DPE_CHECK(have == want, path, ": truncated payload: the header promises ", result.file_items, " items of ",
            row_bytes, " bytes (", total_bytes, " bytes) but the file holds only ", have, " bytes after the ",
            header_bytes, "-byte header");
  if (limited) return result;

  // Nothing may follow the payload: one more byte is asked for, never more (all the trailing data was once
  // read and counted, which took 25 s for a sparse 20 GB file or a gzip bomb). Reaching the end makes zlib
  // check the gzip CRC and length.
  uint8_t extra = 0;
  if (file.read(&extra, 1) != 0) {
    const int64_t after_payload = file.file_bytes() - header_bytes - total_bytes;
    DPE_CHECK(false, path, ": trailing data after ", result.file_items, " items (the ", total_bytes,
              "-byte payload the header promises: ", result.file_items, " items of ", row_bytes, " bytes)",
              file.is_plain() ? dpe::detail::str_cat(": ", after_payload, " more bytes follow") : std::string(),
              "; expected the file to end there");
  }
  return result;
}

}  // namespace dpe::data
