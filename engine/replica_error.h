// The one exception type a step throws when a replica fails (docs/DATA_PARALLEL.md "Errors, never hangs"): what callers of
// DataParallel and DeviceWorkerPool catch to learn which replica failed first.
#pragma once

#include <cstddef>
#include <exception>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"

namespace dpe {

// An exception raised in a replica, rethrown in the caller: "replica 1 on cpu:1: <original message>".
// replica() and device() are the replica that failed first; replicas that failed after it in the same run
// (usually because of it) are context, in the order they failed.
class ReplicaError : public Error {
 public:
  struct Failure {
    int replica;
    Device device;
    std::string message;  // the original message, without the "replica r on d: " prefix
  };
  ReplicaError(int replica, Device device, const std::string& message, std::vector<Failure> later_failures = {});
  int replica() const { return replica_; }
  // The original message, without the "replica r on d: " prefix that what() adds.
  const std::string& message() const { return message_; }
  const Device& device() const { return device_; }
  const std::vector<Failure>& later_failures() const { return later_failures_; }

 private:
  int replica_;
  Device device_;
  std::string message_;
  std::vector<Failure> later_failures_;
};

// "replica r on d failed: <what the error says>": the reason to abort a failed replica's partners with
// (ProcessGroup::abort), so that they do not wait for it. Never throws: out of memory (a likely cause of the
// failure), it is empty, and an abort without its reason still wakes them.
std::string replica_failure_reason(size_t replica, const Device& device, const std::exception_ptr& error) noexcept;

}  // namespace dpe
