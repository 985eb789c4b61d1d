#include "tools/dpe/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace dpe::tool {

namespace {

// Closes a file descriptor once (destructor or close()).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset(int fd) {
    close();
    fd_ = fd;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// pipe2 with O_CLOEXEC: the originals never leak into the child (it gets dup2'd copies) or other children.
void make_pipe(Fd& read_end, Fd& write_end, const std::string& program) {
  int fds[2];
  DPE_CHECK(pipe2(fds, O_CLOEXEC) == 0, "cannot run ", program, ": pipe: ", std::strerror(errno));
  read_end.reset(fds[0]);
  write_end.reset(fds[1]);
}

// Blocks SIGPIPE on this thread while it lives; a SIGPIPE raised by a write to a pipe whose reader exited
// (EPIPE) is taken off the pending set before the old mask is restored, so it is never delivered.
class BlockSigpipe {
 public:
  BlockSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~BlockSigpipe() {
    if (raised_) {
      const timespec zero{};
      while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  void raised() { raised_ = true; }

 private:
  sigset_t pipe_, old_;
  bool raised_ = false;
};

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv, const std::string& input,
                          const ProcessLimits& limits) {
  DPE_CHECK(!argv.empty() && !argv[0].empty(), "run_process: expected a program name");
  DPE_CHECK(limits.seconds > 0 && limits.seconds <= kMaxHelperSeconds && limits.output_bytes > 0,
            "run_process: limits of ", limits.seconds, " s and ", limits.output_bytes, " bytes; expected seconds in (0, ",
            kMaxHelperSeconds, "] and bytes > 0");
  const std::string& program = argv[0];
  Fd in_read, in_write, out_read, out_write;
  make_pipe(in_read, in_write, program);
  make_pipe(out_read, out_write, program);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_read.get(), STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_write.get(), STDOUT_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = posix_spawnp(&pid, program.c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  DPE_CHECK(spawned == 0, "cannot run ", program, ": ", std::strerror(spawned));
  in_read.close();  // the child's ends
  out_write.close();
  // Writes that would block return EAGAIN instead: the loop below then reads before writing more.
  fcntl(in_write.get(), F_SETFL, O_NONBLOCK);

  ProcessResult result;
  result.limit_seconds = limits.seconds;
  result.limit_output_bytes = limits.output_bytes;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limits.seconds);
  {
    BlockSigpipe block;
    size_t written = 0;
    if (input.empty()) in_write.close();
    char buf[65536];
    while (out_read.get() >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        result.timed_out = true;
        break;
      }
      pollfd fds[2] = {{out_read.get(), POLLIN, 0}, {in_write.get(), POLLOUT, 0}};
      const nfds_t count = in_write.get() >= 0 ? 2 : 1;
      const int ready = poll(fds, count, static_cast<int>(std::min<int64_t>(left.count() + 1, 60'000)));
      if (ready < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (ready == 0) continue;
      if (count == 2 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
        const ssize_t n = write(in_write.get(), input.data() + written, input.size() - written);
        if (n > 0) written += static_cast<size_t>(n);
        if (n < 0 && errno == EPIPE) block.raised();
        if ((n < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) in_write.close();
      }
      if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) {
        const ssize_t n = read(out_read.get(), buf, sizeof buf);
        if (n > 0) {
          if (result.output.size() + static_cast<size_t>(n) > limits.output_bytes) {
            result.output_exceeded = true;
            break;
          }
          result.output.append(buf, static_cast<size_t>(n));
        } else if (n == 0 || errno != EINTR) {
          out_read.close();  // end of file: the child closed its standard output (or exited)
        }
      }
    }
    in_write.close();
  }
  bool killed = result.timed_out || result.output_exceeded;
  if (killed) kill(pid, SIGKILL);
  out_read.close();  // a child still writing gets EPIPE, not a full pipe
  // A child may outlive its standard output (closed early): the deadline holds until it exits.
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) break;
    if (!killed && std::chrono::steady_clock::now() >= deadline) {
      result.timed_out = killed = true;
      kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status)) result.exit_status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

std::string find_program(const std::string& program) {
  auto executable = [](const std::string& path) {
    struct stat st {};
    // access() alone says yes to root for any file with one execute bit; the mode bits say what exec will do.
    return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111) != 0 &&
           access(path.c_str(), X_OK) == 0;
  };
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) return executable(program) ? program : "";
  const char* path = std::getenv("PATH");
  // posix_spawnp's default search path when PATH is unset.
  const std::string dirs = path ? path : "/bin:/usr/bin";
  size_t start = 0;
  for (;;) {
    const size_t colon = dirs.find(':', start);
    std::string dir = dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";  // an empty PATH entry is the current directory
    if (executable(dir + "/" + program)) return dir + "/" + program;
    if (colon == std::string::npos) return "";
    start = colon + 1;
  }
}

std::string describe_status(const ProcessResult& result) {
  if (result.timed_out) {
    return dpe::detail::str_cat("killed after running past its ", result.limit_seconds, "-s limit");
  }
  if (result.output_exceeded) {
    const size_t bytes = result.limit_output_bytes;
    return dpe::detail::str_cat("killed after writing more than ", bytes % (1 << 20) == 0 ? bytes >> 20 : bytes,
                                bytes % (1 << 20) == 0 ? " MiB" : " bytes", " to its standard output");
  }
  if (result.signal != 0) {
    return "killed by signal " + std::to_string(result.signal) + " (" + strsignal(result.signal) + ")";
  }
  return "exit status " + std::to_string(result.exit_status);
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

}  // namespace dpe::tool
