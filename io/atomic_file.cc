#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>

#include "core/error.h"
#include "io/temp_file.h"

namespace dpe::io {

namespace {

// Creates the temporary (see the file comment), registered in *scope before it exists; returns its descriptor
// and sets *tmp to its name. A name another writer holds is unregistered at once and another one tried.
int create_temporary(const std::string& path, const std::string& who, std::string* tmp,
                     std::optional<TemporaryFileScope>* scope) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (static_cast<uint64_t>(::getpid()) << 32) ^
                                   static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string name = path + ".tmp.";
    for (int i = 0; i < 6; ++i) name += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
    scope->emplace(name);
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      *tmp = std::move(name);
      return fd;
    }
    const int err = errno;
    scope->reset();
    DPE_CHECK(err == EEXIST || err == EINTR, who, ": cannot create a temporary file ", name, " next to ", path, ": ",
              std::strerror(err));
  }
  DPE_CHECK(false, who, ": cannot create a temporary file next to ", path, ": 100 random names were all taken");
  __builtin_unreachable();
}

}  // namespace

int write_fully(int fd, const void* data, size_t n, size_t* written) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *written = done;
      return w < 0 ? errno : EIO;
    }
    done += static_cast<size_t>(w);
  }
  *written = done;
  return 0;
}

void write_file_atomically(const std::string& path, const std::string& who,
                           const std::function<void(int fd, const std::string& tmp)>& write) {
  std::string tmp;
  std::optional<TemporaryFileScope> scope;  // until the temporary is renamed or removed
  const int fd = create_temporary(path, who, &tmp, &scope);
  try {
    write(fd, tmp);
    DPE_CHECK(::fsync(fd) == 0, who, ": fsync of ", tmp, " failed: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    DPE_CHECK(false, who, ": closing ", tmp, " failed: ", std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    DPE_CHECK(false, who, ": renaming ", tmp, " to ", path, " failed: ", std::strerror(err));
  }
  scope.reset();
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace dpe::io
