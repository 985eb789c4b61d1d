#include "core/device.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <ostream>
#include <thread>

#include "core/error.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#endif

namespace dpe {

namespace {

int default_num_cpu_devices() {
  if (const char* env = std::getenv("DPE_NUM_CPU_DEVICES"); env != nullptr && *env != '\0') {
    int n = 0;
    auto [end, ec] = std::from_chars(env, env + std::char_traits<char>::length(env), n);
    DPE_CHECK(ec == std::errc() && *end == '\0' && n >= 1 && n <= kMaxLogicalDevices, "DPE_NUM_CPU_DEVICES='",
              env, "': expected an integer in [1, ", kMaxLogicalDevices, "]");
    return n;
  }
  return std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
}

std::atomic<int>& cpu_device_count_storage() {
  static std::atomic<int> count{default_num_cpu_devices()};
  return count;
}

std::string_view kind_name(DeviceKind kind) { return kind == DeviceKind::CPU ? "cpu" : "cuda"; }

}  // namespace

Device Device::parse(std::string_view text) {
  auto bad = [&](std::string_view why) {
    DPE_CHECK(false, "invalid device string '", text, "': ", why,
              " (expected 'cpu', 'cpu:N', 'cuda' or 'cuda:N')");
  };
  std::string_view kind_part = text.substr(0, text.find(':'));
  DeviceKind kind;
  if (kind_part == "cpu") {
    kind = DeviceKind::CPU;
  } else if (kind_part == "cuda") {
    kind = DeviceKind::CUDA;
  } else {
    bad("unknown device type '" + std::string(kind_part) + "'");
  }
  if (kind_part.size() == text.size()) return {kind, 0};
  std::string_view index_part = text.substr(kind_part.size() + 1);
  int index = -1;
  auto [end, ec] = std::from_chars(index_part.data(), index_part.data() + index_part.size(), index);
  if (index_part.empty() || ec != std::errc() || end != index_part.data() + index_part.size() || index < 0) {
    bad("index '" + std::string(index_part) + "' is not a non-negative integer");
  }
  return {kind, index};
}

std::string Device::str() const { return std::string(kind_name(kind)) + ":" + std::to_string(index); }

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

int num_cpu_devices() { return cpu_device_count_storage().load(); }

void set_num_cpu_devices(int n) {
  DPE_CHECK(n >= 1 && n <= kMaxLogicalDevices, "set_num_cpu_devices(", n, "): expected [1, ", kMaxLogicalDevices,
            "] CPU devices");
  cpu_device_count_storage().store(n);
}

int cuda_device_count() {
#if DPE_WITH_CUDA
  return cuda::logical_device_count();
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

void set_cuda_logical_devices(const std::vector<int>& physical_ordinals) {
#if DPE_WITH_CUDA
  cuda::set_logical_devices(physical_ordinals);
#else
  DPE_CHECK(false, "set_cuda_logical_devices: this dpe build has no CUDA support");
#endif
}

int device_count(DeviceKind kind) { return kind == DeviceKind::CPU ? num_cpu_devices() : cuda_device_count(); }

void check_device_exists(const Device& d) {
  int count = device_count(d.kind);
  if (d.index >= 0 && d.index < count) return;
  if (count == 0) {
#if DPE_WITH_CUDA
    DPE_CHECK(false, d, " does not exist: no CUDA device is visible (", cuda::unavailable_reason(), ")");
#else
    DPE_CHECK(false, d, " does not exist: this dpe build has no CUDA support");
#endif
  }
  DPE_CHECK(false, d, " does not exist: ", count, " ", kind_name(d.kind), " devices are available (",
            kind_name(d.kind), ":0..", kind_name(d.kind), ":", count - 1, ")");
}

std::vector<Device> all_devices(DeviceKind kind) {
  std::vector<Device> devices;
  for (int i = 0; i < device_count(kind); ++i) devices.push_back({kind, i});
  return devices;
}

}  // namespace dpe
