#include "fuzz/fuzz_target.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace dpe::fuzz {
namespace {

std::atomic<OutcomeSink> g_sink{nullptr};

[[noreturn]] void die(const std::string& what) {
  // The harness's own plumbing failed (not a finding in the code under test): std::runtime_error, which the
  // driver reports and which stops the run.
  throw std::runtime_error("fuzz harness: " + what + ": " + std::strerror(errno));
}

}  // namespace

void note_outcome(std::string_view outcome) {
  if (OutcomeSink sink = g_sink.load(std::memory_order_relaxed)) sink(outcome);
}

void set_outcome_sink(OutcomeSink sink) { g_sink.store(sink); }

std::string_view error_location(std::string_view what) {
  const size_t open = what.rfind(" (");
  if (what.empty() || what.back() != ')' || open == std::string_view::npos) return "?";
  return what.substr(open + 2, what.size() - open - 3);
}

std::string error_signature(std::string_view what) {
  const std::string_view location = error_location(what);
  const std::string_view message = location == "?" ? what : what.substr(0, what.size() - location.size() - 3);
  std::string out(location);
  out += ' ';
  // A quote opens after a space, '(' or the start, and closes before a space, ':', ',', ')' or the end, so
  // that quotes inside the quoted input do not flip the two.
  bool quoted = false;
  for (size_t i = 0; i < message.size() && out.size() < 160; ++i) {
    const char c = message[i];
    const char before = i == 0 ? ' ' : message[i - 1];
    const char after = i + 1 == message.size() ? ' ' : message[i + 1];
    if (c == '\'' && !quoted && (before == ' ' || before == '(')) {
      quoted = true;
      out += "'*";
    } else if (c == '\'' && quoted && (after == ' ' || after == ':' || after == ',' || after == ')')) {
      quoted = false;
      out += '\'';
    } else if (quoted) {
      continue;
    } else if (c >= '0' && c <= '9') {
      if (out.back() != '#') out += '#';
    } else {
      out += c;
    }
  }
  return out;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw Finding("harness oracle failed: " + what);
}

InputFile::InputFile(const std::string& name) {
  fd_ = memfd_create(("dpe_fuzz_" + name).c_str(), MFD_CLOEXEC);
  if (fd_ >= 0) {
    path_ = "/proc/self/fd/" + std::to_string(fd_);
    if (::access(path_.c_str(), R_OK) == 0) return;  // /proc may be missing in odd sandboxes
    ::close(fd_);
  }
  const char* dir = std::getenv("TEST_TMPDIR");
  if (dir == nullptr) dir = std::getenv("TMPDIR");
  if (dir == nullptr) dir = "/tmp";
  path_ = std::string(dir) + "/dpe_fuzz_" + std::to_string(::getpid()) + "_" + name;
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd_ < 0) die("cannot create " + path_);
  unlink_ = true;
}

InputFile::~InputFile() {
  ::close(fd_);
  if (unlink_) ::unlink(path_.c_str());
}

void InputFile::write(const uint8_t* data, size_t size) {
  if (::ftruncate(fd_, 0) != 0) die("ftruncate " + path_);
  size_t done = 0;
  while (done < size) {
    const ssize_t w = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die("write " + path_);
    done += static_cast<size_t>(w);
  }
}

void InputFile::write_gzip(const uint8_t* data, size_t size) {
  z_stream z{};
  // windowBits 15 + 16: a gzip wrapper (header, CRC-32, length), as gzopen(path, "wb") writes.
  if (deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) die("deflateInit2");
  std::vector<uint8_t> out(deflateBound(&z, static_cast<uLong>(size)) + 32);
  z.next_in = const_cast<Bytef*>(data);
  z.avail_in = static_cast<uInt>(size);
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  const int r = deflate(&z, Z_FINISH);
  const size_t n = out.size() - z.avail_out;
  deflateEnd(&z);
  if (r != Z_STREAM_END) die("deflate");
  write(out.data(), n);
}

}  // namespace dpe::fuzz
