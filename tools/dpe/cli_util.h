// Small helpers shared by the dpe tool's subcommands.
#pragma once

#include <string>
#include <vector>

#include "core/device.h"

namespace dpe::tool {

// "cpu:0,cpu:1" -> devices; throws naming a bad entry (empty entries are skipped).
std::vector<Device> parse_device_list(const std::string& list);
// "cpu:0 cpu:1"
std::string device_list_str(const std::vector<Device>& devices);
// Every CUDA device if there is one, else `cpu_count` CPU devices (raising the CPU device count if needed).
std::vector<Device> default_devices(int cpu_count);
// 1024 -> "1K", 64 << 20 -> "64M"
std::string bytes_str(double bytes);

}  // namespace dpe::tool
