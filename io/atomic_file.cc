#include "io/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
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
      // Note [Temporaries of a killed writer]: held while it is written.
      ::flock(fd, LOCK_EX | LOCK_NB);
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

// Note [Temporaries of a killed writer]
// A writer killed by SIGKILL (or the OOM killer, or a power cut) cannot remove its temporary: <path>.tmp.XXXXXX
// stays, as large as the checkpoint was when it died. Every writer holds an exclusive flock on its temporary
// while it writes, and the kernel drops it when the process dies, however it dies; so the next write of the
// same path removes the temporaries nobody holds. Only those older than kStaleAfter: a writer locks its file
// just after creating it, and a file seen in between must not be taken for a dead one.
constexpr auto kStaleAfter = std::chrono::seconds(10);

void remove_stale_temporaries(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string prefix = (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp.";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;  // the write reports what is wrong with the directory
  const auto now = std::chrono::system_clock::now();
  while (const dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string full = dir + "/" + name;
    const int fd = ::open(full.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    struct stat st{};
    const bool old = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                     now - std::chrono::system_clock::from_time_t(st.st_mtime) > kStaleAfter;
    if (old && ::flock(fd, LOCK_EX | LOCK_NB) == 0) ::unlink(full.c_str());  // its writer is gone
    ::close(fd);
  }
  ::closedir(d);
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
  remove_stale_temporaries(path);
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
