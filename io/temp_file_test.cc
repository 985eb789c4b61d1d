#include "io/temp_file.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/testing/errors.h"

namespace dpe::io {
namespace {

namespace fs = std::filesystem;
using dpe::testing::describe_wait_status;

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return (fs::path(dir ? dir : fs::temp_directory_path().string()) / name).string();
}

void touch(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  ::close(fd);
}

// Runs body() in a forked child and returns its wait status. The child exits 0 when body returns; body
// reports a failed expectation with _exit(code) (gtest's assertions do not cross the fork).
int run_in_child(const std::function<void()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    body();
    ::_exit(0);
  }
  EXPECT_GT(pid, 0) << std::strerror(errno);
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return status;
}

struct sigaction current_action(int sig) {
  struct sigaction a;
  ::sigaction(sig, nullptr, &a);
  return a;
}

bool is_default(int sig) {
  const struct sigaction a = current_action(sig);
  return (a.sa_flags & SA_SIGINFO) == 0 && a.sa_handler == SIG_DFL;
}

bool is_ignored(int sig) {
  const struct sigaction a = current_action(sig);
  return (a.sa_flags & SA_SIGINFO) == 0 && a.sa_handler == SIG_IGN;
}

// A signal that would end the process removes the registered temporary, and still ends the process by that
// signal (so a shell or a parent sees the real cause).
TEST(TemporaryFileScope, AFatalSignalRemovesTheTemporaryAndStillEndsTheProcess) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    const std::string path = temp_path("fatal_" + std::to_string(sig) + ".tmp.abcdef");
    touch(path);
    const int status = run_in_child([&] {
      TemporaryFileScope scope(path);
      if (!scope.registered()) ::_exit(10);
      ::raise(sig);
      ::_exit(11);  // survived the signal
    });
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << strsignal(sig) << ": " << describe_wait_status(status);
    EXPECT_FALSE(fs::exists(path)) << strsignal(sig) << " left " << path;
  }
}

// A handler of the program's own is chained to, the file is kept (the program may go on writing it), and it
// is the disposition again once the scope ends.
int g_program_handler_calls = 0;
void program_handler(int, siginfo_t* info, void*) {
  if (info != nullptr && info->si_signo == SIGTERM) ++g_program_handler_calls;
}

TEST(TemporaryFileScope, AProgramHandlerIsChainedAndRestored) {
  const std::string path = temp_path("chained.tmp.abcdef");
  touch(path);
  const int status = run_in_child([&] {
    struct sigaction mine;
    std::memset(&mine, 0, sizeof mine);
    mine.sa_sigaction = program_handler;
    mine.sa_flags = SA_SIGINFO;
    sigemptyset(&mine.sa_mask);
    if (::sigaction(SIGTERM, &mine, nullptr) != 0) ::_exit(10);
    {
      TemporaryFileScope scope(path);
      if (current_action(SIGTERM).sa_sigaction == program_handler) ::_exit(11);  // not installed
      ::raise(SIGTERM);
      if (g_program_handler_calls != 1) ::_exit(12);
      if (::access(path.c_str(), F_OK) != 0) ::_exit(13);  // removed although the program goes on
    }
    if (current_action(SIGTERM).sa_sigaction != program_handler) ::_exit(14);  // not restored
    ::raise(SIGTERM);
    if (g_program_handler_calls != 2) ::_exit(15);
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe_wait_status(status);
  EXPECT_TRUE(fs::exists(path));
}

// An ignored signal (nohup, a background job) stays ignored: nothing is installed over SIG_IGN.
TEST(TemporaryFileScope, AnIgnoredSignalStaysIgnored) {
  const std::string path = temp_path("ignored.tmp.abcdef");
  touch(path);
  const int status = run_in_child([&] {
    ::signal(SIGHUP, SIG_IGN);
    {
      TemporaryFileScope scope(path);
      if (!is_ignored(SIGHUP)) ::_exit(10);
      ::raise(SIGHUP);
    }
    if (!is_ignored(SIGHUP)) ::_exit(11);
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe_wait_status(status);
  EXPECT_TRUE(fs::exists(path));
}

// SIGXFSZ is ignored while a scope lives, so a write past RLIMIT_FSIZE fails with EFBIG (instead of the
// signal ending the process), and it is the default again afterwards.
TEST(TemporaryFileScope, WritesPastTheFileSizeLimitFailInsteadOfKilling) {
  const std::string path = temp_path("limited.tmp.abcdef");
  const int status = run_in_child([&] {
    if (!is_default(SIGXFSZ)) ::_exit(10);
    rlimit limit{4096, RLIM_INFINITY};
    ::getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = 4096;
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(11);
    {
      TemporaryFileScope scope(path);
      if (!is_ignored(SIGXFSZ)) ::_exit(12);
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) ::_exit(13);
      std::vector<char> bytes(8192, 'x');
      if (::write(fd, bytes.data(), 4096) != 4096) ::_exit(14);
      if (::write(fd, bytes.data(), 4096) != -1 || errno != EFBIG) ::_exit(15);
      ::close(fd);
    }
    if (!is_default(SIGXFSZ)) ::_exit(16);
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe_wait_status(status);
}

// Scopes on several threads share the handlers: they stay until the last scope ends.
TEST(TemporaryFileScope, OverlappingScopesRestoreWhenTheLastEnds) {
  const int status = run_in_child([&] {
    if (!is_default(SIGTERM)) ::_exit(10);
    auto a = std::make_unique<TemporaryFileScope>(temp_path("a.tmp.abcdef"));
    auto b = std::make_unique<TemporaryFileScope>(temp_path("b.tmp.abcdef"));
    a.reset();
    if (is_default(SIGTERM) || is_default(SIGXFSZ)) ::_exit(11);
    b.reset();
    if (!is_default(SIGTERM) || !is_default(SIGINT) || !is_default(SIGHUP) || !is_default(SIGXFSZ)) ::_exit(12);
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe_wait_status(status);
}

// A forked child that did not exec does not remove its parent's temporaries when it is signalled.
TEST(TemporaryFileScope, AForkedChildLeavesItsParentsTemporaries) {
  const std::string path = temp_path("parents.tmp.abcdef");
  touch(path);
  const int status = run_in_child([&] {
    TemporaryFileScope scope(path);
    const pid_t grandchild = ::fork();
    if (grandchild == 0) {
      ::raise(SIGTERM);
      ::_exit(20);
    }
    int st = 0;
    ::waitpid(grandchild, &st, 0);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGTERM) ::_exit(10);
    if (::access(path.c_str(), F_OK) != 0) ::_exit(11);
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe_wait_status(status);
  EXPECT_TRUE(fs::exists(path));
}

// More live scopes than slots: the extra ones say they are not registered (and still work).
TEST(TemporaryFileScope, AFullRegistryIsReported) {
  std::vector<std::unique_ptr<TemporaryFileScope>> scopes;
  for (int i = 0; i < kMaxTemporaries; ++i) {
    scopes.push_back(std::make_unique<TemporaryFileScope>(temp_path("full.tmp." + std::to_string(i))));
    EXPECT_TRUE(scopes.back()->registered()) << i;
  }
  TemporaryFileScope extra(temp_path("full.tmp.extra"));
  EXPECT_FALSE(extra.registered());
  scopes.pop_back();
  TemporaryFileScope again(temp_path("full.tmp.again"));
  EXPECT_TRUE(again.registered());
  EXPECT_FALSE(TemporaryFileScope(std::string(PATH_MAX, 'x')).registered());  // too long for a slot
}

}  // namespace
}  // namespace dpe::io
