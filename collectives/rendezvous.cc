#include "collectives/rendezvous.h"

#include <sstream>

#include "core/cpu_cores.h"
#include "core/error.h"
#include "core/spin_wait.h"

namespace dpe {

Rendezvous::Rendezvous(std::vector<Device> members, std::chrono::milliseconds timeout)
    : members_(std::move(members)),
      timeout_(timeout),
      spin_(spin_budget(static_cast<int>(members_.size()), usable_cores())),
      present_(members_.size(), false) {
  DPE_CHECK(!members_.empty(), "Rendezvous: no members");
  DPE_CHECK(timeout.count() > 0, "process group timeout must be positive, got ", timeout.count(), " ms");
}

void Rendezvous::meet(int rank, const std::string& what) {
  std::unique_lock lock(mutex_);
  DPE_CHECK_WITH(ErrorKind::Aborted, !aborted_, "process group is aborted: ", reason());
  DPE_INTERNAL_ASSERT(!present_[rank], "rank ", rank, " met twice in one meeting");
  present_[rank] = true;
  if (++arrived_ == static_cast<int>(members_.size())) {
    arrived_ = 0;
    present_.assign(members_.size(), false);
    generation_.fetch_add(1, std::memory_order_release);
    cv_.notify_all();
    return;
  }
  const uint64_t generation = generation_.load(std::memory_order_relaxed);
  // The others usually come within microseconds when every member has its own core: see them without the
  // cost of a wake-up (core/spin_wait.h). An abort is noticed under the lock below.
  lock.unlock();
  if (spin_until([&] { return generation_.load(std::memory_order_acquire) != generation; }, spin_)) {
    return;
  }
  lock.lock();
  bool met = cv_.wait_for(lock, timeout_, [&] { return generation_ != generation || aborted_; });
  if (met && generation_ != generation) return;
  if (!met) {
    aborted_ = true;  // first: out of memory below, the other members must still wake
    try {
      std::ostringstream missing;
      const char* sep = "";
      missing_at_last_timeout_.clear();
      for (size_t r = 0; r < members_.size(); ++r) {
        if (present_[r]) continue;
        missing << sep << members_[r] << " (rank " << r << ")";
        sep = ", ";
        missing_at_last_timeout_.push_back(static_cast<int>(r));
      }
      abort_reason_ = detail::str_cat(what, " timed out after ", timeout_.count(), " ms on ", members_[rank],
                                      ": waiting for ", missing.str(), ", which never called it");
    } catch (...) {
    }
    cv_.notify_all();
    DPE_CHECK_WITH(ErrorKind::Timeout, false, reason());
  }
  // Woken by an abort: another member's failure, or the timeout of a member that waited (that member alone
  // throws Timeout; the rest of the group is Aborted, with the same message).
  DPE_CHECK_WITH(ErrorKind::Aborted, false, reason());
}

void Rendezvous::abort(const std::string& reason) noexcept {
  std::lock_guard lock(mutex_);
  if (!aborted_) {
    // The flag first: a reason that cannot be copied (out of memory) must not keep the members waiting.
    aborted_ = true;
    try {
      abort_reason_ = reason;
    } catch (...) {
    }
  }
  cv_.notify_all();
}

const char* Rendezvous::reason() const {
  return abort_reason_.empty() ? detail::kReasonLost : abort_reason_.c_str();
}

void Rendezvous::reset() {
  std::lock_guard lock(mutex_);
  aborted_ = false;
  abort_reason_.clear();
  arrived_ = 0;
  present_.assign(members_.size(), false);
}

std::vector<int> Rendezvous::missing_at_last_timeout() const {
  std::lock_guard lock(mutex_);
  return missing_at_last_timeout_;
}

void Rendezvous::check_open() const {
  std::lock_guard lock(mutex_);
  DPE_CHECK_WITH(ErrorKind::Aborted, !aborted_, "process group is aborted: ", reason());
}

bool Rendezvous::aborted() const {
  std::lock_guard lock(mutex_);
  return aborted_;
}

}  // namespace dpe
