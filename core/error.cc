#include "core/error.h"

namespace dpe::detail {

namespace {
// Keep messages readable: "core/tensor.cc:42: ..." rather than an absolute build path.
const char* short_path(const char* file) {
  std::string_view path(file);
  for (std::string_view root : {"core/", "layers/", "engine/", "scatter_gather/", "collectives/", "tools/", "tests/"}) {
    if (auto pos = path.rfind(root); pos != std::string_view::npos) return file + pos;
  }
  return file;
}
}  // namespace

std::string printable(const std::string& message) {
  std::string out;
  out.reserve(message.size());
  for (const char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte == '\0') {
      out += "\\0";
    } else if ((byte < 0x20 && byte != '\n' && byte != '\t') || byte == 0x7f) {
      const char hex[] = "0123456789abcdef";
      out += {'\\', 'x', hex[byte >> 4], hex[byte & 15]};
    } else {
      out += c;
    }
  }
  return out;
}

void throw_error(const char* file, int line, const std::string& message, ErrorKind kind) {
  throw Error(str_cat(message, " (", short_path(file), ":", line, ")"), kind);
}

void throw_internal_error(const char* file, int line, const char* condition, const std::string& message) {
  throw InternalError(str_cat("dpe internal error: ", condition, " failed at ", short_path(file), ":", line,
                              message.empty() ? "" : ": ", message,
                              ". This is a bug in dpe; please report it."));
}

}  // namespace dpe::detail

namespace dpe {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidArgument: return "invalid argument";
    case ErrorKind::OutOfMemory: return "out of memory";
    case ErrorKind::Timeout: return "timeout";
    case ErrorKind::Aborted: return "aborted";
    case ErrorKind::DeviceLost: return "device lost";
    case ErrorKind::Internal: return "internal";
  }
  return "unknown";
}

}  // namespace dpe
