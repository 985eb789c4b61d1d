#include "io/temp_file.h"

#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

namespace dpe::io {
namespace {

// A slot's life: Free -> Claimed (its owner copies the path in) -> Ready -> Free (the owner's scope ended), or
// Ready -> Unlinking (a signal handler took it; it stays so: the process is ending, and an owner that finds
// it so must not free a slot the handler may still be reading).
enum SlotState : int { kFree = 0, kClaimed = 1, kReady = 2, kUnlinking = 3 };

struct Slot {
  std::atomic<int> state{kFree};
  pid_t pid = 0;
  char path[PATH_MAX];
};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

Slot g_slots[kMaxTemporaries];

constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP};

std::mutex g_mutex;  // guards the rest; never taken by the handler
int g_active = 0;    // live scopes
// The dispositions found when the first scope began: what the handler chains to and what the last scope
// restores. Written before the handler is installed, read by it.
struct sigaction g_previous[NSIG];
bool g_installed[NSIG];

// Unlinks every path this process registered (async-signal-safe).
void unlink_registered() {
  const pid_t self = ::getpid();
  for (Slot& slot : g_slots) {
    int expected = kReady;
    if (slot.state.load(std::memory_order_acquire) != kReady || slot.pid != self) continue;
    if (slot.state.compare_exchange_strong(expected, kUnlinking, std::memory_order_acquire)) ::unlink(slot.path);
  }
}

extern "C" void on_cleanup_signal(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const struct sigaction& previous = g_previous[sig];
  if (previous.sa_handler == SIG_DFL) {
    unlink_registered();
    // The default action, raised again: `sig` is blocked while this handler runs, so it is delivered when the
    // handler returns, and ends the process with sig's status.
    ::sigaction(sig, &previous, nullptr);
    ::raise(sig);
  } else if ((previous.sa_flags & SA_SIGINFO) != 0) {
    previous.sa_sigaction(sig, info, context);
  } else if (previous.sa_handler != SIG_IGN) {  // never installed over SIG_IGN; kept for safety
    previous.sa_handler(sig);
  }
  errno = saved_errno;
}

bool is_ours(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) != 0 && action.sa_sigaction == on_cleanup_signal;
}

void begin_scope() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_active++ > 0) return;
  for (int sig : kCleanupSignals) {
    g_installed[sig] = false;
    struct sigaction current;
    if (::sigaction(sig, nullptr, &current) != 0) continue;
    if ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_IGN) continue;  // stays ignored
    g_previous[sig] = current;
    struct sigaction ours;
    std::memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_cleanup_signal;
    // SA_RESTART: a write interrupted by a chained handler that returns goes on.
    ours.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&ours.sa_mask);
    for (int other : kCleanupSignals) sigaddset(&ours.sa_mask, other);
    g_installed[sig] = ::sigaction(sig, &ours, nullptr) == 0;
  }
  struct sigaction ignore;
  std::memset(&ignore, 0, sizeof ignore);
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  g_installed[SIGXFSZ] = ::sigaction(SIGXFSZ, &ignore, &g_previous[SIGXFSZ]) == 0;
}

void end_scope() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_active > 0) return;
  for (int sig : kCleanupSignals) {
    if (!g_installed[sig]) continue;
    g_installed[sig] = false;
    struct sigaction current;
    if (::sigaction(sig, nullptr, &current) == 0 && is_ours(current)) ::sigaction(sig, &g_previous[sig], nullptr);
  }
  if (g_installed[SIGXFSZ]) {
    g_installed[SIGXFSZ] = false;
    struct sigaction current;
    if (::sigaction(SIGXFSZ, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) == 0 &&
        current.sa_handler == SIG_IGN) {
      ::sigaction(SIGXFSZ, &g_previous[SIGXFSZ], nullptr);
    }
  }
}

}  // namespace

TemporaryFileScope::TemporaryFileScope(const std::string& path) {
  begin_scope();
  if (path.empty() || path.size() >= sizeof(Slot::path) || path.find('\0') != std::string::npos) return;
  for (int i = 0; i < kMaxTemporaries; ++i) {
    Slot& slot = g_slots[i];
    int expected = kFree;
    if (!slot.state.compare_exchange_strong(expected, kClaimed, std::memory_order_acquire)) continue;
    std::memcpy(slot.path, path.c_str(), path.size() + 1);
    slot.pid = ::getpid();
    slot.state.store(kReady, std::memory_order_release);
    slot_ = i;
    return;
  }
}

TemporaryFileScope::~TemporaryFileScope() {
  if (slot_ >= 0) {
    int expected = kReady;
    // Fails only when a handler took the slot (kUnlinking): it is then left to the ending process.
    g_slots[slot_].state.compare_exchange_strong(expected, kFree, std::memory_order_release);
  }
  end_scope();
}

}  // namespace dpe::io
