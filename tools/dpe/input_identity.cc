#include "tools/dpe/input_identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace dpe::tool {

namespace {

constexpr uint64_t kFnvOffset = 14695981039346656037ull, kFnvPrime = 1099511628211ull;

struct Closer {
  int fd;
  ~Closer() { ::close(fd); }
};

// Folds bytes [offset, offset + n) of `fd` into `hash`.
void hash_range(int fd, const std::string& path, uint64_t offset, uint64_t n, uint64_t& hash) {
  std::vector<unsigned char> buffer(std::min<uint64_t>(n, uint64_t{1} << 20));
  while (n > 0) {
    const ssize_t r = ::pread(fd, buffer.data(), std::min<uint64_t>(n, buffer.size()), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    DPE_CHECK(r > 0, path, ": cannot read byte ", offset, " (", r < 0 ? std::strerror(errno) : "the file shrank",
              ") while naming what this process reads");
    for (ssize_t i = 0; i < r; ++i) hash = (hash ^ buffer[static_cast<size_t>(i)]) * kFnvPrime;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
}

}  // namespace

std::string file_identity(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) return "absent";
  DPE_CHECK(fd >= 0, path, ": cannot open (", std::strerror(errno), ") while naming what this process reads");
  const Closer closer{fd};
  struct stat st{};
  DPE_CHECK(::fstat(fd, &st) == 0, path, ": cannot stat (", std::strerror(errno), ")");
  if (!S_ISREG(st.st_mode)) return "not a regular file";  // its reader refuses it, naming it
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint64_t hash = kFnvOffset;
  const bool sampled = size > kWholeFileHashBytes;
  if (sampled) {
    hash_range(fd, path, 0, kSampleBytes, hash);
    hash_range(fd, path, size - kSampleBytes, kSampleBytes, hash);
  } else {
    hash_range(fd, path, 0, size, hash);
  }
  char text[96];
  std::snprintf(text, sizeof text, "%" PRIu64 " bytes, fnv1a64 %016" PRIx64 "%s", size, hash,
                sampled ? ", first and last 4 MiB" : "");
  return text;
}

}  // namespace dpe::tool
