#include "engine/replica_error.h"

namespace dpe {

ReplicaError::ReplicaError(int replica, Device device, const std::string& message, std::vector<Failure> later_failures)
    : Error(detail::str_cat("replica ", replica, " on ", device, ": ", message)),
      replica_(replica),
      device_(device),
      message_(message),
      later_failures_(std::move(later_failures)) {}

std::string replica_failure_reason(size_t replica, const Device& device, const std::exception_ptr& error) noexcept {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return detail::str_cat_or_empty("replica ", replica, " on ", device, " failed: ", e.what());
  } catch (...) {
    return detail::str_cat_or_empty("replica ", replica, " on ", device, " failed");
  }
}

}  // namespace dpe
