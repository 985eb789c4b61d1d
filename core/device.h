// Devices: "cpu:N" and "cuda:N".
//
// CPU devices are logical: cpu:0..cpu:N-1 share the host, each with its own allocator accounting and
// (in the engine) its own worker thread and share of the cores, so the whole engine runs and is tested
// without a GPU. N defaults to max(2, hardware threads), or $DPE_NUM_CPU_DEVICES, or set_num_cpu_devices().
//
// CUDA device indices are the visible ordinals (after CUDA_VISIBLE_DEVICES). For testing multi-device code
// on one GPU, set_cuda_logical_devices({0, 0, 0}) makes cuda:0..cuda:2 three logical devices on physical
// GPU 0, each with its own stream, handles and memory accounting.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace dpe {

enum class DeviceKind : uint8_t { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;

  static Device cpu(int index = 0) { return {DeviceKind::CPU, index}; }
  static Device cuda(int index = 0) { return {DeviceKind::CUDA, index}; }
  // Parses "cpu", "cpu:3", "cuda", "cuda:1"; throws naming the string on anything else.
  // Does not check that the device exists (see check_device_exists).
  static Device parse(std::string_view text);

  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  std::string str() const;  // "cpu:0", "cuda:1"

  friend bool operator==(const Device&, const Device&) = default;
  friend auto operator<=>(const Device&, const Device&) = default;
};

std::ostream& operator<<(std::ostream& os, const Device& d);

// Each logical device costs a worker thread and an allocator in the engine: at most this many, of each kind.
inline constexpr int kMaxLogicalDevices = 1024;

int num_cpu_devices();
// Changes the number of logical CPU devices, n in [1, kMaxLogicalDevices]. Tensors already on a removed device
// stay valid.
void set_num_cpu_devices(int n);

// Number of logical CUDA devices: 0 when dpe is built without CUDA or no GPU/driver is present.
int cuda_device_count();
bool cuda_available();
// Maps logical CUDA devices cuda:0..cuda:N-1 onto the given visible GPUs (repeats allowed: {0, 0} gives
// two logical devices with their own streams on GPU 0). Throws naming a bad ordinal and the valid range,
// and throws once any CUDA device has been used (stream, allocation, copy): call it at startup.
// Throws in a build without CUDA support.
void set_cuda_logical_devices(const std::vector<int>& physical_ordinals);
int device_count(DeviceKind kind);

// Throws unless `d` exists, naming the device and the valid range ("cuda:3 does not exist: 2 CUDA
// devices are visible (cuda:0..cuda:1)").
void check_device_exists(const Device& d);

// All devices of a kind: cpu:0..N-1 or cuda:0..N-1.
std::vector<Device> all_devices(DeviceKind kind);

}  // namespace dpe

template <>
struct std::hash<dpe::Device> {
  size_t operator()(const dpe::Device& d) const noexcept {
    return std::hash<int>()(d.index * 2 + static_cast<int>(d.kind));
  }
};
