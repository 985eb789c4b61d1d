// Error reporting. Two kinds of failure, never mixed up:
//  - caller errors (bad shape, bad device string, out-of-range id): DPE_CHECK throws dpe::Error with a
//    message that names the values involved;
//  - dpe's own bugs (a broken invariant): DPE_INTERNAL_ASSERT throws dpe::InternalError, asking for a report.
// Nothing in dpe calls exit() or abort(): worker threads must be able to carry an error back to the caller.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dpe {

namespace detail {
// `message` with its control bytes shown as escapes ("\0", "\x1b"; newlines and tabs kept): a name read from
// a file may hold any byte, and a NUL would end what() there (the rest of the line lost), an escape
// sequence would reach the user's terminal.
std::string printable(const std::string& message);
}  // namespace detail

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(detail::printable(message)) {}
  explicit Error(const char* message) : Error(std::string(message)) {}
};

class InternalError : public Error {
 public:
  using Error::Error;
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

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
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

// DPE_INTERNAL_ASSERT(cond, optional message...): a dpe bug if it fires.
#define DPE_INTERNAL_ASSERT(cond, ...)                                                   \
  do {                                                                                   \
    if (!(cond)) [[unlikely]] {                                                          \
      ::dpe::detail::throw_internal_error(__FILE__, __LINE__, #cond,                     \
                                          ::dpe::detail::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                    \
  } while (0)
