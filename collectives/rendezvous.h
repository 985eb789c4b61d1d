// The meeting point of a process group's members: a reusable barrier with a timeout and an abort switch.
//
// Every collective is two meetings: `arrive` (every member has posted its arguments, so each may read the
// others') and `depart` (every member has finished reading and writing the others' buffers, so each may
// return and reuse its own). A member that does not come within the timeout is an error naming it, not a
// hang: the first member to time out aborts the rendezvous, which wakes every waiting member with the same
// message, and every later meeting throws it too until reset().
//
// Thread-safety: meet() is called by the members concurrently, each with its own rank; abort() by anyone;
// reset() only while no member is inside meet().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/device.h"

namespace dpe {

class Rendezvous {
 public:
  Rendezvous(std::vector<Device> members, std::chrono::milliseconds timeout);

  // Blocks until every member has called meet() for this meeting. `what` names the operation in errors
  // ("all_reduce #12"). Throws dpe::Error on timeout (naming the members that did not come) or abort: of kind
  // ErrorKind::Timeout on the member whose wait ran out (the first; it aborts the rendezvous), of kind
  // ErrorKind::Aborted on every member the abort wakes or finds (the timeout's message or abort()'s reason).
  void meet(int rank, const std::string& what);
  // Wakes every waiting member with an error carrying `reason`; later meetings throw it until reset(). The
  // first abort's reason is kept. Never throws: out of memory while keeping the reason, the members are woken
  // all the same, with an error that says the reason was lost.
  void abort(const std::string& reason) noexcept;
  void reset();
  bool aborted() const;
  // Throws the error meet() would throw now that the rendezvous is aborted (ErrorKind::Aborted); returns when
  // it is not.
  void check_open() const;
  std::chrono::milliseconds timeout() const { return timeout_; }
  // The ranks the last timeout waited for (empty before any); kept across reset(), replaced by the next.
  std::vector<int> missing_at_last_timeout() const;

 private:
  const char* reason() const;  // under mutex_, once aborted_

  std::vector<Device> members_;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds spin_;  // how long a member spins before it blocks (core/spin_wait.h)
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<bool> present_;  // who has come to the current meeting
  int arrived_ = 0;
  // Meetings completed. Written under mutex_; read without it by a member spinning before it blocks.
  std::atomic<uint64_t> generation_{0};
  bool aborted_ = false;
  std::string abort_reason_;  // empty when an abort could not keep it (reason() says so)
  std::vector<int> missing_at_last_timeout_;
};

}  // namespace dpe
