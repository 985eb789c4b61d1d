#include "tools/dpe/json_report.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "core/error.h"

namespace dpe::tool {

double as_printed(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return std::strtod(buf, nullptr);
}

void write_json_report(const std::string& option, const std::string& path, const JsonReport& report) {
  std::ofstream out(path);
  DPE_CHECK(out.good(), option, " ", path, ": cannot open for writing");
  out << report.dump(-1, ' ', /*ensure_ascii=*/false, JsonReport::error_handler_t::replace) << "\n";
  out.close();
  DPE_CHECK(out.good(), option, " ", path, ": write failed");
}

void dispose(JsonReport& report) noexcept {
  if (!report.is_structured()) return;
  for (JsonReport& child : report) dispose(child);
  report.clear();
}

}  // namespace dpe::tool
