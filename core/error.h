// Error reporting. Two kinds of failure, never mixed up:
//  - caller errors (bad shape, bad device string, out-of-range id): DPE_CHECK throws dpe::Error with a
//    message that names the values involved;
//  - dpe's own bugs (a broken invariant): DPE_INTERNAL_ASSERT throws dpe::InternalError, asking for a report.
// Nothing in dpe calls exit() or abort(): worker threads must be able to carry an error back to the caller.
// Every Error has a kind (ErrorKind): code that handles some failures (drop a device that ran out of memory,
// find the member a timeout waited for) asks the kind, never the message's text.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace dpe {

enum class ErrorKind : uint8_t {
  InvalidArgument,  // a caller's error: a bad value, shape, device, file or configuration (DPE_CHECK's)
  OutOfMemory,      // an allocation failed: a device's memory, a kernel's buffer, oneDNN's, a thread's
  Timeout,          // a wait ran past its timeout (a collective's member that did not arrive)
  Aborted,          // a collective ended by another member's failure (its process group was aborted)
  DeviceLost,       // a device's worker still busy past the straggler timeout (stuck in a kernel)
  Internal,         // a bug in dpe (DPE_INTERNAL_ASSERT)
};

// "invalid argument", "out of memory", "timeout", "aborted", "device lost", "internal".
const char* error_kind_name(ErrorKind kind);

namespace detail {
// `message` with its control bytes shown as escapes ("\0", "\x1b"; newlines and tabs kept): a name read from
// a file may hold any byte, and a NUL would end what() there (the rest of the line lost), an escape
// sequence would reach the user's terminal.
std::string printable(const std::string& message);
}  // namespace detail

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, ErrorKind kind = ErrorKind::InvalidArgument)
      : std::runtime_error(detail::printable(message)), kind_(kind) {}
  explicit Error(const char* message, ErrorKind kind = ErrorKind::InvalidArgument) : Error(std::string(message), kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

class InternalError : public Error {
 public:
  explicit InternalError(const std::string& message) : Error(message, ErrorKind::Internal) {}
};

namespace detail {

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// str_cat's message, or, when building it runs out of memory, as much of it as could be built (possibly
// nothing), never an exception: for the reasons passed to a process group's abort(), which must reach the
// members waiting in a collective even then.
template <typename... Args>
std::string str_cat_or_empty(const Args&... args) noexcept {
  try {
    return str_cat(args...);
  } catch (...) {
    return {};
  }
}

// What a failure reads where its reason was empty or could not be kept (out of memory while recording it).
inline constexpr char kReasonLost[] = "a member failed, and the reason was lost (out of memory while recording it)";

[[noreturn]] void throw_error(const char* file, int line, const std::string& message,
                              ErrorKind kind = ErrorKind::InvalidArgument);
[[noreturn]] void throw_internal_error(const char* file, int line, const char* condition,
                                       const std::string& message);

}  // namespace detail
}  // namespace dpe

// DPE_CHECK(cond, "expected ", a, " got ", b): throws dpe::Error when cond is false.
#define DPE_CHECK(cond, ...)                                                         \
  do {                                                                               \
    if (!(cond)) [[unlikely]] {                                                      \
      ::dpe::detail::throw_error(__FILE__, __LINE__, ::dpe::detail::str_cat(__VA_ARGS__)); \
    }                                                                                \
  } while (0)

// DPE_CHECK_WITH(ErrorKind::OutOfMemory, ptr != nullptr, "out of memory ..."): DPE_CHECK with another kind
// (PyTorch's TORCH_CHECK_WITH).
#define DPE_CHECK_WITH(kind, cond, ...)                                                         \
  do {                                                                                          \
    if (!(cond)) [[unlikely]] {                                                                 \
      ::dpe::detail::throw_error(__FILE__, __LINE__, ::dpe::detail::str_cat(__VA_ARGS__), kind); \
    }                                                                                           \
  } while (0)

// DPE_INTERNAL_ASSERT(cond, optional message...): a dpe bug if it fires.
#define DPE_INTERNAL_ASSERT(cond, ...)                                                   \
  do {                                                                                   \
    if (!(cond)) [[unlikely]] {                                                          \
      ::dpe::detail::throw_internal_error(__FILE__, __LINE__, #cond,                     \
                                          ::dpe::detail::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                    \
  } while (0)
