// write_file_atomically's temporaries: one left by a writer killed with SIGKILL is removed by the next write of the
// same path (Note [Temporaries of a killed writer]); one a live writer holds, a fresh one, and other names stay.
#include "io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace dpe::io {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void touch(const std::string& path, bool old) {
  std::ofstream(path) << "partial";
  if (!old) return;
  const timeval an_hour_ago[2] = {{.tv_sec = ::time(nullptr) - 3600, .tv_usec = 0},
                                  {.tv_sec = ::time(nullptr) - 3600, .tv_usec = 0}};
  ASSERT_EQ(::utimes(path.c_str(), an_hour_ago), 0);
}

void write_hello(const std::string& path) {
  write_file_atomically(path, "test", [](int fd, const std::string&) {
    size_t written = 0;
    ASSERT_EQ(write_fully(fd, "hello", 5, &written), 0);
  });
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(AtomicFile, ATemporaryOfAWriterKilledOutrightGoesWithTheNextWrite) {
  const std::string dir = fresh_dir("killed"), path = dir + "/model.ck";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // dies inside its write: no handler, no destructor runs
    write_file_atomically(path, "child", [](int fd, const std::string&) {
      size_t written = 0;
      (void)write_fully(fd, "half", 4, &written);
      ::kill(::getpid(), SIGKILL);
    });
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  std::vector<std::string> left = names_in(dir);
  ASSERT_EQ(left.size(), 1u);
  ASSERT_EQ(left[0].rfind("model.ck.tmp.", 0), 0u) << left[0];
  touch(dir + "/" + left[0], /*old=*/true);  // as if it died a while ago
  write_hello(path);
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"model.ck"});
}

TEST(AtomicFile, HeldFreshAndOtherTemporariesStay) {
  const std::string dir = fresh_dir("kept"), path = dir + "/model.ck";
  touch(path + ".tmp.FRESH1", /*old=*/false);       // a writer that has not locked it yet, for all we know
  touch(path + ".tmp.HELD22", /*old=*/true);        // held by a live writer:
  const int held = ::open((path + ".tmp.HELD22").c_str(), O_RDONLY);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  touch(path + ".tmp.DEAD33", /*old=*/true);        // nobody's
  touch(path + ".tmp.SHORT", /*old=*/true);         // not a name write_file_atomically makes
  touch(dir + "/other.ck.tmp.DEAD44", /*old=*/true);  // another path's
  write_hello(path);
  ::close(held);
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"model.ck", "model.ck.tmp.FRESH1", "model.ck.tmp.HELD22",
                                                     "model.ck.tmp.SHORT", "other.ck.tmp.DEAD44"}));
}

}  // namespace
}  // namespace dpe::io
