#include "tools/dpe/cli_util.h"

#include <cstdio>
#include <sstream>

namespace dpe::tool {

std::vector<Device> parse_device_list(const std::string& list) {
  std::vector<Device> devices;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) devices.push_back(Device::parse(item));
  }
  return devices;
}

std::string device_list_str(const std::vector<Device>& devices) {
  std::string out;
  for (const Device& d : devices) out += (out.empty() ? "" : " ") + d.str();
  return out;
}

std::vector<Device> default_devices(int cpu_count) {
  if (cuda_available()) return all_devices(DeviceKind::CUDA);
  if (num_cpu_devices() < cpu_count) set_num_cpu_devices(cpu_count);
  std::vector<Device> devices;
  for (int i = 0; i < cpu_count; ++i) devices.push_back(Device::cpu(i));
  return devices;
}

std::string bytes_str(double bytes) {
  const char* units[] = {"", "K", "M", "G"};
  int u = 0;
  while (bytes >= 1024 && u < 3) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, bytes == static_cast<int64_t>(bytes) ? "%.0f%s" : "%.1f%s", bytes, units[u]);
  return buf;
}

}  // namespace dpe::tool
