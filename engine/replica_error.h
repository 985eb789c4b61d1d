// The one exception type a step throws when a replica fails (docs/DATA_PARALLEL.md "Errors, never hangs"): what callers of
// DataParallel and DeviceWorkerPool catch to learn which replica failed first, and of what kind of failure.
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
// (usually because of it) are context, in the order they failed. kind() is the kind of the first replica's
// original exception (error_kind_of), each later failure carries its own: a failure policy asks them
// (ErrorKind::OutOfMemory, Timeout, DeviceLost), never the message's text.
class ReplicaError : public Error {
 public:
  struct Failure {
    int replica;
    Device device;
    std::string message;  // the original message, without the "replica r on d: " prefix
    ErrorKind kind = ErrorKind::InvalidArgument;  // the original exception's (error_kind_of)
  };
  // `kind` last, after the failures: a caller that rethrows a ReplicaError with a new message passes its
  // kind() on, or the failure becomes InvalidArgument.
  ReplicaError(int replica, Device device, const std::string& message, std::vector<Failure> later_failures = {},
               ErrorKind kind = ErrorKind::InvalidArgument);
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

// The kind of a failure raised in a replica, for ReplicaError:
//  - a dpe::Error (ReplicaError and InternalError included): its kind();
//  - std::bad_alloc: OutOfMemory;
//  - std::system_error with EAGAIN or ENOMEM: OutOfMemory (a thread that could not be created: memory or the
//    thread limit ran out; the dpe tool's exit status 3 likewise);
//  - any other exception, std::exception or not: InvalidArgument. dpe reports its own bugs as InternalError
//    and its failures as the types above, so anything else comes from code run on the caller's behalf (a loss
//    function, a task) and is the caller's; InvalidArgument is also what a dpe::Error is unless it says
//    otherwise, so only a failure known to be one claims a kind a failure policy acts on.
// A null exception_ptr is InvalidArgument.
ErrorKind error_kind_of(const std::exception_ptr& error) noexcept;

// "replica r on d failed: <what the error says>": the reason to abort a failed replica's partners with
// (ProcessGroup::abort), so that they do not wait for it. Never throws: out of memory (a likely cause of the
// failure), it is empty, and an abort without its reason still wakes them.
std::string replica_failure_reason(size_t replica, const Device& device, const std::exception_ptr& error) noexcept;

}  // namespace dpe
