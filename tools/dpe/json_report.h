// The --json reports of dpe train, bench and collectives: nlohmann-json, keys in the order they are added.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dpe::tool {

using JsonReport = nlohmann::ordered_json;

// `v` as printf's `format` shows it (e.g. "%.6f", "%g"), as a double: a report keeps the digits it always
// had, and nlohmann writes the shortest text that reads back as that double.
double as_printed(const char* format, double v);

// Writes `report` and a newline to `path` (checked at start-up with check_output_path); invalid UTF-8 in a
// string is replaced, not an exception. Throws naming `option` and `path` when the file cannot be written.
void write_json_report(const std::string& option, const std::string& path, const JsonReport& report);

}  // namespace dpe::tool
