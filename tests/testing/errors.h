// error_of(f): the message of the dpe::Error that f() throws, or "(no error)". Tests check messages name
// the offending values: EXPECT_NE(error_of([&] { x.view({7}); }).find("invalid for 6 elements"), npos).
// run_members(n, fn): fn(r) for r in [0, n), each on a thread of its own, all at once (a ProcessGroup's members).
// describe_wait_status(status): how a forked child ended, for messages ("exit 3", "signal 15 (Terminated)").
#pragma once

#include <sys/wait.h>

#include <cstring>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace dpe::testing {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Each member's error_of message after all have finished, "" for a member that threw nothing.
inline std::vector<std::string> run_members(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const std::string e = error_of([&] { fn(r); });
      errors[static_cast<size_t>(r)] = e == "(no error)" ? "" : e;
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

inline std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  }
  return "status " + std::to_string(status);
}

}  // namespace dpe::testing
