// Note [What the processes read must be the same] (input_identity.h): a file's identity follows its bytes,
// whatever its path; a large file's, its first and last bytes and its size.
#include "tools/dpe/input_identity.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace dpe::tool {
namespace {

std::string temp_path(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(InputIdentityTest, FollowsTheBytesNotThePath) {
  const std::string a = temp_path("a.bin"), b = temp_path("b.bin");
  write(a, "the same bytes");
  write(b, "the same bytes");
  EXPECT_EQ(file_identity(a), file_identity(b));
  EXPECT_NE(file_identity(a).find("14 bytes, fnv1a64 "), std::string::npos) << file_identity(a);
  write(b, "the same bytez");
  EXPECT_NE(file_identity(a), file_identity(b));
  write(b, "the same bytes ");
  EXPECT_NE(file_identity(a), file_identity(b));
  write(b, "");
  EXPECT_NE(file_identity(b).find("0 bytes, fnv1a64 cbf29ce484222325"), std::string::npos) << file_identity(b);
}

TEST(InputIdentityTest, AbsentOrNotAFile) {
  EXPECT_EQ(file_identity(temp_path("no_such_file")), "absent");
  const std::string dir = temp_path("a_directory");
  ::mkdir(dir.c_str(), 0755);
  EXPECT_EQ(file_identity(dir), "not a regular file");
}

// Above kWholeFileHashBytes only the first and last kSampleBytes are read: a change there shows, one in the
// middle does not (the documented price of a fast start-up), a change of size always does.
TEST(InputIdentityTest, LargeFilesBySizeAndTheirEnds) {
  std::string bytes(kWholeFileHashBytes + 3 * kSampleBytes, 'x');
  const std::string a = temp_path("large_a.bin"), b = temp_path("large_b.bin");
  write(a, bytes);
  const std::string identity = file_identity(a);
  EXPECT_NE(identity.find(", first and last 4 MiB"), std::string::npos) << identity;
  bytes[bytes.size() / 2] = 'y';
  write(b, bytes);
  EXPECT_EQ(file_identity(b), identity);
  bytes[kSampleBytes - 1] = 'y';
  write(b, bytes);
  EXPECT_NE(file_identity(b), identity);
  bytes[kSampleBytes - 1] = 'x';
  bytes[bytes.size() - kSampleBytes] = 'y';
  write(b, bytes);
  EXPECT_NE(file_identity(b), identity);
  bytes[bytes.size() - kSampleBytes] = 'x';
  bytes.push_back('x');
  write(b, bytes);
  EXPECT_NE(file_identity(b), identity);
}

}  // namespace
}  // namespace dpe::tool
