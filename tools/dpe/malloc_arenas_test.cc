// Note [One malloc arena under an address-space limit], in child processes (glibc fixes its arena limit once
// per process, at a second thread's first allocation, so each case needs a fresh process whose threads have
// not allocated yet): four threads allocate at once, and malloc_info counts the arenas they got.
#include "tools/dpe/malloc_arenas.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace dpe::tool {
namespace {

// The arenas glibc's malloc has made in this process: malloc_info writes one <heap nr="..."> per arena.
int arenas() {
  char* text = nullptr;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  if (out == nullptr) return -1;
  malloc_info(0, out);
  std::fclose(out);
  int count = 0;
  for (const char* at = text; (at = std::strstr(at, "<heap nr=")) != nullptr; ++at) ++count;
  std::free(text);
  return count;
}

// Four threads that each allocate while all four are alive (a thread that has exited leaves its arena free
// for the next one, which would hide the count).
void allocate_on_four_threads() {
  std::atomic<int> allocated{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      void* volatile p = std::malloc(64);
      ++allocated;
      while (allocated.load() < 4) std::this_thread::yield();
      std::free(p);
    });
  }
  for (std::thread& t : threads) t.join();
}

// Runs `child` in a fork and returns its exit status (or 100 + the signal that ended it).
template <typename F>
int in_child(F child) {
  const pid_t pid = fork();
  if (pid == 0) std::_Exit(child());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

// The child's result: 0 if it limited malloc as `expect_limited` says, else 1; then 10 + the arena count.
int run_case(bool set_limit, bool expect_limited) {
  if (set_limit) {
    // 4 GiB, room for every arena glibc would make (or the hard limit, if lower); the hard limit stays.
    rlimit limit{};
    if (getrlimit(RLIMIT_AS, &limit) != 0) return 2;
    limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? rlim_t{4} << 30 : std::min(rlim_t{4} << 30, limit.rlim_max);
    if (setrlimit(RLIMIT_AS, &limit) != 0) return 2;
  }
  if (one_malloc_arena_under_address_limit() != expect_limited) return 1;
  allocate_on_four_threads();
  return 10 + arenas();
}

TEST(OneMallocArena, UnderAnAddressSpaceLimitEveryThreadSharesOne) {
  unsetenv("MALLOC_ARENA_MAX");
  EXPECT_EQ(in_child([] { return run_case(/*set_limit=*/true, /*expect_limited=*/true); }), 10 + 1);
}

// The control: without a limit glibc makes arenas for the threads (so the count above can fail).
TEST(OneMallocArena, WithoutALimitMallocKeepsItsArenas) {
  unsetenv("MALLOC_ARENA_MAX");
  struct rlimit current {};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &current), 0);
  if (current.rlim_cur != RLIM_INFINITY) GTEST_SKIP() << "this test runs under an address-space limit already";
  const int status = in_child([] { return run_case(/*set_limit=*/false, /*expect_limited=*/false); });
  EXPECT_GT(status, 10 + 1);
  EXPECT_LT(status, 100);
}

// The user's own choice wins.
TEST(OneMallocArena, MallocArenaMaxSetByTheUserIsLeftAlone) {
  setenv("MALLOC_ARENA_MAX", "8", 1);
  EXPECT_EQ(in_child([] { return run_case(/*set_limit=*/true, /*expect_limited=*/false) >= 10 ? 0 : 1; }), 0);
  unsetenv("MALLOC_ARENA_MAX");
}

}  // namespace
}  // namespace dpe::tool
