// The --json reports of dpe train, bench and collectives: nlohmann-json, keys in the order they are added.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dpe::tool {

using JsonReport = nlohmann::ordered_json;

// `v` as printf's `format` shows it (e.g. "%.6f", "%g"), as a double: a report keeps the digits it always
// had, and nlohmann writes the shortest text that reads back as that double.
double as_printed(const char* format, double v);

// Writes `report` and a newline to `path` (checked at start-up with check_output_file, file_args.h); invalid UTF-8 in a
// string is replaced, not an exception. Throws naming `option` and `path` when the file cannot be written.
void write_json_report(const std::string& option, const std::string& path, const JsonReport& report);

// Note [A report's destructor allocates]
// nlohmann-json destroys a non-empty array or object by moving its children onto a heap-allocated stack
// (json.hpp, json_value::destroy), so a destructor can run out of memory, and an exception out of a
// destructor is std::terminate (tools/reliability/alloc_failure_test.sh found it at the end of `dpe train`).
// dispose(report) empties the containers from the leaves up (basic_json::clear is noexcept and, on
// containers already empty, allocates nothing); the destructor then has nothing to move.
void dispose(JsonReport& report) noexcept;

// Disposes of `report` when it goes out of scope: declare it right after a report that lives across work
// that may run out of memory, so that it runs first.
class DisposeOnExit {
 public:
  explicit DisposeOnExit(JsonReport& report) : report_(report) {}
  ~DisposeOnExit() { dispose(report_); }
  DisposeOnExit(const DisposeOnExit&) = delete;
  DisposeOnExit& operator=(const DisposeOnExit&) = delete;

 private:
  JsonReport& report_;
};

}  // namespace dpe::tool
