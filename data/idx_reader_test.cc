#include "data/idx_reader.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
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
                  {path + ": trailing data after 3 items (the 3-byte payload the header promises: 3 items of 1 "
                          "bytes); expected the file to end there"});
  // A plain file says how much follows (its size on disk tells).
  const std::string plain = test_dir() + "/labels";
  const std::vector<uint8_t> bytes = idx_bytes(kIdxLabelsMagic, {3}, iota_bytes(5));
  std::ofstream(plain, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  expect_contains(error_of([&] { read_idx(plain, kIdxLabelsMagic); }),
                  {plain + ": trailing data after 3 items", ": 2 more bytes follow; expected the file to end there"});
}

// Bytes this process has read with read(2) and its kin so far (/proc/self/io's rchar); -1 when unknown.
int64_t bytes_read_so_far() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return -1;
}

// Regression: trailing data was read to its end to be counted: a gzip bomb, or a
// sparse 20 GB file, after a valid payload took 25 s. Now one byte past the payload is asked for, never more:
// the 200 MB of zeros after the payload (200 KB compressed) are neither decompressed nor even read.
TEST(IdxReader, TrailingGzipBombIsNotDecompressed) {
  const std::string path = test_dir() + "/labels.gz";
  {
    gzFile f = gzopen(path.c_str(), "wb9");
    ASSERT_NE(f, nullptr);
    const std::vector<uint8_t> valid = idx_bytes(kIdxLabelsMagic, {3}, iota_bytes(3));
    ASSERT_EQ(gzwrite(f, valid.data(), static_cast<unsigned>(valid.size())), static_cast<int>(valid.size()));
    const std::vector<uint8_t> zeros(1 << 20, 0);
    for (int i = 0; i < 200; ++i) ASSERT_EQ(gzwrite(f, zeros.data(), 1 << 20), 1 << 20);
    ASSERT_EQ(gzclose(f), Z_OK);
  }
  const int64_t gz_bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  ASSERT_GT(gz_bytes, 150 * 1024);  // the whole compressed stream is much more than zlib's first buffer
  const int64_t before = bytes_read_so_far();
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] { read_idx(path, kIdxLabelsMagic); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t read = bytes_read_so_far() - before;
  expect_contains(message, {path + ": trailing data after 3 items"});
  EXPECT_LT(seconds, 5.0);
  if (before >= 0) {
    EXPECT_LT(read, 64 * 1024) << read << " of the " << gz_bytes << " compressed bytes were read";
  }
}

// The same for a plain file whose payload is followed by a sparse gigabyte (no disk space used).
TEST(IdxReader, TrailingSparseDataIsNotRead) {
  const std::string path = test_dir() + "/labels";
  const std::vector<uint8_t> bytes = idx_bytes(kIdxLabelsMagic, {3}, iota_bytes(3));
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::filesystem::resize_file(path, uint64_t{1} << 30);
  const int64_t before = bytes_read_so_far();
  const std::string message = error_of([&] { read_idx(path, kIdxLabelsMagic); });
  const int64_t read = bytes_read_so_far() - before;
  expect_contains(message, {path + ": trailing data after 3 items", std::to_string((int64_t{1} << 30) - 11) +
                                                                       " more bytes follow"});
  if (before >= 0) {
    EXPECT_LT(read, 1 << 20) << read << " bytes were read";
  }
}

// Regression: the items' sizes were checked after the whole payload was read, so a
// file of 28x29 images with a short payload failed as "truncated", and a long one was read before failing.
// They are checked right after the header.
TEST(IdxReader, ItemSizesAreCheckedBeforeThePayload) {
  const std::string path = test_dir() + "/images.gz";
  const IdxReadOptions images{.item_dims = {28, 28}, .item_name = "images"};
  write_gz(path, idx_bytes(kIdxImagesMagic, {3, 28, 29}, iota_bytes(10)));  // 3 * 28 * 29 promised
  std::string message = error_of([&] { read_idx(path, kIdxImagesMagic, images); });
  expect_contains(message, {path + ": images are 28x29; expected 28x28 (the header's sizes are [3, 28, 29])"});
  EXPECT_EQ(message.find("truncated"), std::string::npos) << message;
  // Sizes whose product overflows are about the sizes too, not the arithmetic.
  write_gz(path, idx_bytes(kIdxImagesMagic, {0xffffffff, 0xffffffff, 0xffff}, {}));
  expect_contains(error_of([&] { read_idx(path, kIdxImagesMagic, images); }),
                  {path + ": images are 4294967295x65535; expected 28x28"});
  // The right sizes read as before; options whose rank differs from the file's are the caller's error.
  write_gz(path, idx_bytes(kIdxImagesMagic, {1, 2, 2}, iota_bytes(4)));
  EXPECT_EQ(read_idx(path, kIdxImagesMagic, {.item_dims = {2, 2}}).data, iota_bytes(4));
  expect_contains(error_of([&] { read_idx(path, kIdxImagesMagic, {.item_dims = {4}}); }),
                  {"read_idx: item_dims [4] has 1 sizes but " + path + "'s magic 0x00000803 has 2 per item"});
}

// Regression: a FIFO without a writer blocked forever in open(). It is refused at
// once, naming the file and what it is. (Were it to block, a writer is opened after 2 s so the test ends.)
TEST(IdxReader, AFifoWithoutAWriterIsRefusedAtOnce) {
  const std::string fifo = test_dir() + "/labels.gz";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  auto result = std::async(std::launch::async, [&] { return error_of([&] { read_idx(fifo, kIdxLabelsMagic); }); });
  if (result.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
    ADD_FAILURE() << "read_idx blocked on a FIFO without a writer";
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // lets the blocked open() return
    if (fd >= 0) ::close(fd);
  }
  expect_contains(result.get(), {"cannot read " + fifo + ": it is a FIFO (named pipe), not a regular file; "
                                                         "expected an IDX file"});
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
  expect_contains(error_of([] { read_idx("/dev/zero", kIdxLabelsMagic, {.open_hint = "pass --data-dir"}); }),
                  {"cannot read /dev/zero: it is a character device, not a regular file; expected an IDX file; "
                   "pass --data-dir"});
  expect_contains(error_of([] { read_idx("/dev/null", kIdxLabelsMagic); }),
                  {"cannot read /dev/null: it is a character device, not a regular file"});
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
