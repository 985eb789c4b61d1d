// Fuzz target: the JSON reader of safetensors headers (io/safetensors_header.h: nlohmann-json with the
// header's checks: duplicate keys, nesting depth, exact integers). Oracle: whatever parses, dumps to text that
// parses again to the same dump (parse(dump(v)) == v); dpe::Error is the only accepted failure (an nlohmann
// exception escaping is a finding).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "io/safetensors_header.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dpe;
  using namespace dpe::io;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_only_dpe_errors("parse", [&] {
    const safetensors::Json v = safetensors::parse_header(text);
    const std::string once = safetensors::dump_header(v);
    std::string twice;
    try {
      twice = safetensors::dump_header(safetensors::parse_header(once));
    } catch (const Error& e) {
      fuzz::require(false, "dump_header() wrote text that parse_header() rejects: " + std::string(e.what()));
    }
    fuzz::require(once == twice, "parse(dump(v)) == v");
  });
  return 0;
}
