// Temporaries that a fatal signal does not leave behind, and writes past `ulimit -f` that fail instead of
// killing the process (io/checkpoint.cc writes every checkpoint through one).
//
//   {
//     io::TemporaryFileScope scope(tmp);     // before the file is created
//     int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
//     ...  write(fd, ...) fails with EFBIG past RLIMIT_FSIZE instead of raising SIGXFSZ
//     ::rename(tmp.c_str(), path.c_str());  // or unlink it on an error
//   }                                       // unregistered (the file itself is left alone)
//
// Note [Temporaries and fatal signals]. While at least one TemporaryFileScope is alive in the process:
//   - SIGINT, SIGTERM and SIGHUP have a handler of this file, unless their disposition was SIG_IGN (an ignored
//     signal stays ignored). When the disposition it replaced was SIG_DFL (the signal would end the process),
//     the handler unlinks every registered path of this process, restores SIG_DFL and re-raises the signal,
//     so the process still ends by that signal (exit status 128 + n in a shell, WTERMSIG for a parent). When
//     it replaced a handler of the program's own, it calls that handler (chained, with its siginfo when it
//     was an SA_SIGINFO one) and unlinks nothing: the program decides whether to end, and a write it lets go
//     on must still find its file.
//   - SIGXFSZ is ignored, so a write() past the file size limit (RLIMIT_FSIZE, `ulimit -f`) returns EFBIG,
//     which the writer reports as an error, instead of the signal ending the process without a word and
//     leaving the temporary.
// When the last scope ends, each disposition is put back as it was found (a handler installed by somebody
// else in the meantime is left in place). Scopes may live on several threads at once (refcounted under a
// mutex).
// Async-signal-safety: the registry is a fixed array of slots (kMaxTemporaries, each a path of at most
// PATH_MAX - 1 bytes and the pid that registered it) claimed and released with lock-free atomics; the
// handler only reads them, calls unlink, sigaction and raise (all async-signal-safe) and keeps errno. A path
// is registered before the file is created, so no signal can find a created file unregistered; a scope whose
// path did not fit (full registry, path too long) reports registered() false and the file is then not
// removed on a signal (the write itself is unaffected). A forked child that did not exec never unlinks its
// parent's temporaries (the pid is compared). SIGKILL, a crash or a power cut still leave the temporary: its
// readers must ignore such names (load_checkpoint opens only the final path). Relative paths are resolved
// against the working directory at the time of the signal.
#pragma once

#include <string>

namespace dpe::io {

inline constexpr int kMaxTemporaries = 64;

class TemporaryFileScope {
 public:
  explicit TemporaryFileScope(const std::string& path);
  ~TemporaryFileScope();
  TemporaryFileScope(const TemporaryFileScope&) = delete;
  TemporaryFileScope& operator=(const TemporaryFileScope&) = delete;

  // Whether a fatal signal will remove the file (see the Note).
  bool registered() const { return slot_ >= 0; }

 private:
  int slot_ = -1;
};

}  // namespace dpe::io
