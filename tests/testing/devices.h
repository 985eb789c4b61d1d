// cpu_devices(n): cpu:0..cpu:n-1, first raising the number of logical CPU devices to at least n, so that
// multi-device tests run the same on a 2-core machine and a 64-core one.
#pragma once

#include <algorithm>
#include <vector>

#include "core/device.h"

namespace dpe::testing {

inline std::vector<Device> cpu_devices(int n) {
  set_num_cpu_devices(std::max(num_cpu_devices(), n));
  std::vector<Device> devices;
  for (int i = 0; i < n; ++i) devices.push_back(Device::cpu(i));
  return devices;
}

}  // namespace dpe::testing
