// Fuzz target: the JSON reader of safetensors headers (engine/json.h). Oracle: whatever parses, dumps to
// text that parses again to the same dump (parse(dump(v)) == v).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/json.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dpe;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_only_dpe_errors("parse", [&] {
    const json::Value v = json::parse(text);
    const std::string once = json::dump(v);
    std::string twice;
    try {
      twice = json::dump(json::parse(once));
    } catch (const Error& e) {
      fuzz::require(false, "dump() wrote text that parse() rejects: " + std::string(e.what()));
    }
    fuzz::require(once == twice, "parse(dump(v)) == v");
  });
  return 0;
}
