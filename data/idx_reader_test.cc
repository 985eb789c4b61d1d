#include "data/idx_reader.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "data/test_files.h"
#include "tests/testing/errors.h"

namespace dpe::data {
namespace {

using dpe::testing::error_of;
using testing::idx_bytes;
using testing::test_dir;
using testing::write_gz;

std::vector<uint8_t> iota_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  std::iota(v.begin(), v.end(), uint8_t{0});
  return v;
}

// EXPECT that message contains every one of parts.
void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& p : parts) {
    EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' in: " << message;
  }
}

TEST(IdxReader, ReadsImagesBigEndianSizes) {
  const std::string path = test_dir() + "/images.gz";
  // 2 items of 3x4: sizes 2, 3, 4 big-endian; 300 as a size would read as 0x2c010000 little-endian.
  write_gz(path, idx_bytes(kIdxImagesMagic, {2, 3, 4}, iota_bytes(24)));
  IdxArray a = read_idx(path, kIdxImagesMagic);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(a.file_items, 2);
  EXPECT_EQ(a.data, iota_bytes(24));
}

TEST(IdxReader, SizesAboveOneByte) {
  const std::string path = test_dir() + "/labels.gz";
  write_gz(path, idx_bytes(kIdxLabelsMagic, {300}, std::vector<uint8_t>(300, 7)));
  IdxArray a = read_idx(path, kIdxLabelsMagic);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{300}));
  EXPECT_EQ(a.data.size(), 300u);
}

TEST(IdxReader, ReadsPlainUncompressedFiles) {
  const std::string path = test_dir() + "/labels";
  const std::vector<uint8_t> bytes = idx_bytes(kIdxLabelsMagic, {5}, iota_bytes(5));
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  EXPECT_EQ(read_idx(path, kIdxLabelsMagic).data, iota_bytes(5));
}

TEST(IdxReader, MaxItemsReadsAPrefix) {
  const std::string path = test_dir() + "/images.gz";
  write_gz(path, idx_bytes(kIdxImagesMagic, {4, 2, 2}, iota_bytes(16)));
  IdxArray a = read_idx(path, kIdxImagesMagic, {.max_items = 3});
  EXPECT_EQ(a.dims, (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(a.file_items, 4);
  EXPECT_EQ(a.data, iota_bytes(12));
  // More than the file holds: everything.
  EXPECT_EQ(read_idx(path, kIdxImagesMagic, {.max_items = 10}).dims[0], 4);
  EXPECT_EQ(read_idx(path, kIdxImagesMagic, {.max_items = 0}).data.size(), 0u);
}

TEST(IdxReader, MissingFileNamesPathReasonAndHint) {
  const std::string path = test_dir() + "/nope.gz";
  expect_contains(error_of([&] { read_idx(path, kIdxLabelsMagic, {.open_hint = "try harder"}); }),
                  {"cannot open " + path + ": No such file or directory; try harder"});
}

TEST(IdxReader, BadMagic) {
  const std::string path = test_dir() + "/labels.gz";
  write_gz(path, idx_bytes(kIdxImagesMagic, {1, 1, 1}, {0}));
  expect_contains(error_of([&] { read_idx(path, kIdxLabelsMagic); }),
                  {path, "bad magic number 2051 (0x00000803, unsigned bytes, 3 dimensions)",
                   "expected 2049 (0x00000801, unsigned bytes, 1 dimension)"});
  write_gz(path, {'h', 'e', 'l', 'l', 'o', '!'});
  expect_contains(error_of([&] { read_idx(path, kIdxLabelsMagic); }), {path, "not an IDX file"});
}

TEST(IdxReader, ShortHeader) {
  const std::string path = test_dir() + "/images.gz";
  write_gz(path, {0, 0});
  expect_contains(error_of([&] { read_idx(path, kIdxImagesMagic); }), {path, "too short", "(2 bytes)"});
  write_gz(path, idx_bytes(kIdxImagesMagic, {10, 28}, {}));  // the third size is missing
  expect_contains(error_of([&] { read_idx(path, kIdxImagesMagic); }),
                  {path, "header ends early: size 2 of 3 is missing"});
}

TEST(IdxReader, TruncatedPayload) {
  const std::string path = test_dir() + "/images.gz";
  write_gz(path, idx_bytes(kIdxImagesMagic, {3, 2, 2}, iota_bytes(11)));  // 12 promised
  expect_contains(error_of([&] { read_idx(path, kIdxImagesMagic); }),
                  {path, "truncated payload", "3 items of 4 bytes (12 bytes)", "only 11 bytes",
                   "16-byte header"});
  // Also when only a prefix is asked for that the file does not hold.
  expect_contains(error_of([&] { read_idx(path, kIdxImagesMagic, {.max_items = 3}); }),
                  {path, "truncated payload"});
  EXPECT_EQ(read_idx(path, kIdxImagesMagic, {.max_items = 2}).data.size(), 8u);
}

TEST(IdxReader, TrailingData) {
  const std::string path = test_dir() + "/labels.gz";
  write_gz(path, idx_bytes(kIdxLabelsMagic, {3}, iota_bytes(5)));  // 3 promised, 5 present
  expect_contains(error_of([&] { read_idx(path, kIdxLabelsMagic); }),
                  {path, "2 unexpected trailing bytes after the payload of 3 bytes"});
}

TEST(IdxReader, HugeSizesAreACorruptHeaderNotAnAllocation) {
  const std::string path = test_dir() + "/images.gz";
  write_gz(path, idx_bytes(kIdxImagesMagic, {0xffffffff, 0xffffffff, 0xffff}, {}));
  expect_contains(error_of([&] { read_idx(path, kIdxImagesMagic); }), {path, "header is corrupt"});
  write_gz(path, idx_bytes(kIdxImagesMagic, {1000000, 1000, 1000}, iota_bytes(10)));  // claims 10^12 bytes
  expect_contains(error_of([&] { read_idx(path, kIdxImagesMagic); }), {path, "truncated payload"});
}

// Regression (found by fuzz/idx_fuzz under UBSan): with 0 items the total stayed 0, so the item size (the
// product of the other sizes) overflowed int64 unchecked.
TEST(IdxReader, HugeItemsOfAnEmptyFileAreACorruptHeader) {
  const std::string path = test_dir() + "/empty_but_huge.idx";
  const uint32_t magic = 0x0804;  // unsigned bytes, four dimensions
  std::vector<uint8_t> bytes = idx_bytes(magic, {0, 0xffffffff, 0xffffffff, 0xffffffff}, {});
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  expect_contains(error_of([&] { read_idx(path, magic); }), {path, "header is corrupt"});
}

// A header promising more than the file can hold fails before the payload is allocated or read, naming the
// sizes: for a plain file its size on disk, for a gzip file that size times deflate's largest ratio (1032).
TEST(IdxReader, OversizedHeaderFailsBeforeAllocating) {
  const std::string dir = test_dir();
  // Plain: 2^40 bytes promised (1024 x 1024 x 1048576), 10 present.
  const std::string plain = dir + "/images";
  const std::vector<uint8_t> bytes = idx_bytes(kIdxImagesMagic, {1024, 1024, 1048576}, iota_bytes(10));
  std::ofstream(plain, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  expect_contains(error_of([&] { read_idx(plain, kIdxImagesMagic); }),
                  {plain, "truncated payload", "1024 items of 1073741824 bytes (1099511627776 bytes)",
                   "holds only 10 bytes after the 16-byte header"});

  // gzip: 2^40 bytes promised, 256 MiB of zeros present (about 250 KiB compressed). Reading before checking
  // once grew the payload to all 256 MiB before reporting it short; now nothing is read.
  const std::string gz = dir + "/images.gz";
  {
    gzFile f = gzopen(gz.c_str(), "wb9");
    ASSERT_NE(f, nullptr);
    const std::vector<uint8_t> header = idx_bytes(kIdxImagesMagic, {1024, 1024, 1048576}, {});
    ASSERT_EQ(gzwrite(f, header.data(), static_cast<unsigned>(header.size())), static_cast<int>(header.size()));
    const std::vector<uint8_t> zeros(1 << 20, 0);
    for (int i = 0; i < 256; ++i) ASSERT_EQ(gzwrite(f, zeros.data(), 1 << 20), 1 << 20);
    ASSERT_EQ(gzclose(f), Z_OK);
  }
  const int64_t gz_bytes = static_cast<int64_t>(std::filesystem::file_size(gz));
  rusage before, after;
  getrusage(RUSAGE_SELF, &before);
  const std::string message = error_of([&] { read_idx(gz, kIdxImagesMagic); });
  getrusage(RUSAGE_SELF, &after);
  expect_contains(message, {gz, "the header promises 1024 items of 1073741824 bytes (1099511627776 bytes to read)",
                            "the " + std::to_string(gz_bytes) + "-byte gzip file decompresses to at most " +
                                std::to_string(gz_bytes * 1032) + " bytes"});
  // ru_maxrss is the peak resident size in KiB: reading the payload would have raised it by 256 MiB.
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 64 * 1024) << "the payload was read into memory";
}

// Paths that are not IDX files say so.
TEST(IdxReader, DirectoriesAndDevices) {
  const std::string dir = test_dir();
  expect_contains(error_of([&] { read_idx(dir, kIdxLabelsMagic, {.open_hint = "pass --data-dir"}); }),
                  {"cannot read " + dir + ": Is a directory; expected an IDX file; pass --data-dir"});
  expect_contains(error_of([] { read_idx("/dev/zero", kIdxLabelsMagic); }),
                  {"/dev/zero: bad magic number 0 (0x00000000"});
  expect_contains(error_of([] { read_idx("/dev/null", kIdxLabelsMagic); }),
                  {"/dev/null: the file is too short for an IDX header (0 bytes)"});
}

TEST(IdxReader, DamagedGzipStream) {
  const std::string dir = test_dir();
  const std::string good = dir + "/good.gz";
  write_gz(good, idx_bytes(kIdxLabelsMagic, {4096}, iota_bytes(4096)));
  std::ifstream in(good, std::ios::binary);
  std::vector<char> gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(gz.size(), 30u);

  // Cut in the middle of the compressed data: zlib reports the stream as truncated.
  const std::string cut = dir + "/cut.gz";
  std::ofstream(cut, std::ios::binary).write(gz.data(), gz.size() / 2);
  expect_contains(error_of([&] { read_idx(cut, kIdxLabelsMagic); }), {cut, "truncated"});

  // A flipped bit in the CRC-32 trailer: the data decompresses, the check at the end fails.
  const std::string bad_crc = dir + "/crc.gz";
  std::vector<char> flipped = gz;
  flipped[flipped.size() - 8] ^= 1;
  std::ofstream(bad_crc, std::ios::binary).write(flipped.data(), flipped.size());
  expect_contains(error_of([&] { read_idx(bad_crc, kIdxLabelsMagic); }), {bad_crc, "corrupt gzip data"});
}

TEST(IdxReader, RejectsNonByteExpectedMagic) {
  expect_contains(error_of([] { read_idx("/dev/null", 0x00000d01); }), {"not an IDX magic number"});
}

}  // namespace
}  // namespace dpe::data
