// Fuzz target: device strings (Device::parse, core/device.h) and the dpe tool's device lists
// (tool::parse_device_list, tools/dpe/cli_util.h). Oracles: a parsed device has index >= 0 and its str()
// parses back to it; a parsed list prints and parses back to itself.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "fuzz/fuzz_target.h"
#include "tools/dpe/cli_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dpe;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_only_dpe_errors("device", [&] {
    const Device d = Device::parse(text);
    fuzz::require(d.index >= 0, "Device::parse gives index >= 0");
    fuzz::require(Device::parse(d.str()) == d, "Device::parse(d.str()) == d");
  });
  fuzz::expect_only_dpe_errors("list", [&] {
    const std::vector<Device> devices = tool::parse_device_list(text);
    std::string joined;
    for (const Device& d : devices) {
      fuzz::require(d.index >= 0, "parse_device_list gives indices >= 0");
      joined += (joined.empty() ? "" : ",") + d.str();
    }
    fuzz::require(tool::parse_device_list(joined) == devices, "parse_device_list round trip");
  });
  return 0;
}
