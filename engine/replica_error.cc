#include "engine/replica_error.h"

#include <new>
#include <system_error>

namespace dpe {

ReplicaError::ReplicaError(int replica, Device device, const std::string& message, std::vector<Failure> later_failures,
                           ErrorKind kind)
    : Error(detail::str_cat("replica ", replica, " on ", device, ": ", message), kind),
      replica_(replica),
      device_(device),
      message_(message),
      later_failures_(std::move(later_failures)) {}

ErrorKind error_kind_of(const std::exception_ptr& error) noexcept {
  if (!error) return ErrorKind::InvalidArgument;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e.kind();
  } catch (const std::bad_alloc&) {
    return ErrorKind::OutOfMemory;
  } catch (const std::system_error& e) {
    const bool resources = e.code() == std::errc::resource_unavailable_try_again ||
                           e.code() == std::errc::not_enough_memory;
    return resources ? ErrorKind::OutOfMemory : ErrorKind::InvalidArgument;
  } catch (...) {
    return ErrorKind::InvalidArgument;
  }
}

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
