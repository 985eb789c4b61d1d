#include "engine/replica_error.h"

namespace dpe {

ReplicaError::ReplicaError(int replica, Device device, const std::string& message, std::vector<Failure> later_failures)
    : Error(detail::str_cat("replica ", replica, " on ", device, ": ", message)),
      replica_(replica),
      device_(device),
      message_(message),
      later_failures_(std::move(later_failures)) {}

}  // namespace dpe
