// The one exception type a step throws when a replica fails (docs/DATA_PARALLEL.md "Errors, never hangs"): what callers of
// DataParallel and DeviceWorkerPool catch to learn which replica failed first.
#pragma once

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

}  // namespace dpe
