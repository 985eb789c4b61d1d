// Fuzz target: the IDX reader (data/idx_reader.h) on arbitrary file contents.
//
// Each input is read three ways: as a plain file (whole, and the first item only: max_items = 1), and
// gzip-compressed by the harness (a valid gzip stream around the mutated bytes, so the IDX checks behind
// zlib are fuzzed too; the corpus's own .gz seeds, mutated, fuzz zlib's error paths). The expected magic is
// the input's own when it is an unsigned-byte IDX magic (0x000008DD), so every dimension count is reached.
#include <zlib.h>

#include <cstddef>
#include <cstdint>

#include "data/idx_reader.h"
#include "fuzz/fuzz_target.h"

namespace {

bool is_idx_u8_magic(const uint8_t* p) { return p[0] == 0 && p[1] == 0 && p[2] == 0x08; }

// The first 4 bytes of the data, decompressed when the input is a gzip stream; 0 when there are fewer.
uint32_t leading_word(const uint8_t* data, size_t size) {
  uint8_t word[4] = {0, 0, 0, 0};
  if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
    z_stream z{};
    if (inflateInit2(&z, 15 + 16) != Z_OK) return 0;
    z.next_in = const_cast<Bytef*>(data);
    z.avail_in = static_cast<uInt>(size);
    z.next_out = word;
    z.avail_out = 4;
    inflate(&z, Z_SYNC_FLUSH);
    const bool full = z.avail_out == 0;
    inflateEnd(&z);
    if (!full) return 0;
  } else if (size >= 4) {
    for (int i = 0; i < 4; ++i) word[i] = data[i];
  } else {
    return 0;
  }
  if (!is_idx_u8_magic(word)) return 0;
  return (uint32_t{word[2]} << 8) | word[3];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dpe;
  static fuzz::InputFile plain("idx"), gz("idx.gz");
  uint32_t magic = leading_word(data, size);
  if (magic == 0) magic = data::kIdxImagesMagic;

  plain.write(data, size);
  fuzz::expect_only_dpe_errors("plain", [&] {
    const data::IdxArray a = data::read_idx(plain.path(), magic);
    int64_t bytes = 1;
    for (int64_t d : a.dims) bytes *= d;
    fuzz::require(bytes == static_cast<int64_t>(a.data.size()), "prod(dims) == data.size()");
  });
  fuzz::expect_only_dpe_errors("first", [&] {
    const data::IdxArray a = data::read_idx(plain.path(), magic, {.max_items = 1});
    fuzz::require(!a.dims.empty() && a.dims[0] <= 1, "max_items = 1 reads at most one item");
  });
  gz.write_gzip(data, size);
  fuzz::expect_only_dpe_errors("gz", [&] { data::read_idx(gz.path(), magic); });
  return 0;
}
