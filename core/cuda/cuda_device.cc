// Logical CUDA devices (core/cuda/cuda_device.h).
//
// Note [CUDA device mapping is frozen on first use]
// The logical -> physical mapping may change only while no logical device has been used. The first call
// that works on a logical device (physical_device, stream, cublas_handle, cudnn_handle, synchronize,
// DeviceGuard, hence every allocation and copy) freezes it: after that, blocks in the caching allocators,
// streams and cuBLAS/cuDNN handles belong to a particular physical GPU, and remapping would silently mix GPUs up.
//
// Streams and handles live until the process exits and are never destroyed: destroying them from a static
// destructor can run after the CUDA runtime has been torn down (the allocators follow the same rule).
#include "core/cuda/cuda_device.h"

#include <deque>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "core/cuda/cuda_check.h"
#include "core/device.h"
#include "core/error.h"

namespace dpe::cuda {

namespace {

struct PhysicalInfo {
  int count = 0;
  std::string unavailable_reason;  // set when count == 0
};

const PhysicalInfo& physical_info() {
  static const PhysicalInfo info = [] {
    PhysicalInfo result;
    cudaError_t status = cudaGetDeviceCount(&result.count);
    if (status != cudaSuccess) {
      // No driver (cudaErrorInsufficientDriver), no GPU (cudaErrorNoDevice), ...: zero devices, not an error.
      cudaGetLastError();  // clear it, so the next launch check does not report it
      result.count = 0;
      result.unavailable_reason =
          ::dpe::detail::str_cat("cudaGetDeviceCount: ", cudaGetErrorName(status), ": ", cudaGetErrorString(status));
    } else if (result.count == 0) {
      result.unavailable_reason = "cudaGetDeviceCount found no CUDA device";
    }
    return result;
  }();
  return info;
}

// Per-logical-device resources, each created once (std::call_once) on first use.
struct Slot {
  explicit Slot(int physical) : physical(physical) {}
  const int physical;
  std::once_flag stream_once;
  cudaStream_t stream = nullptr;
  std::once_flag cublas_once;
  cublasHandle_t cublas = nullptr;
  std::once_flag cudnn_once;
  cudnnHandle_t cudnn = nullptr;
};

struct Registry {
  std::mutex mutex;
  std::deque<Slot> slots;  // deque: Slot is not movable, and references stay valid while it grows
  bool frozen = false;     // Note [CUDA device mapping is frozen on first use]
};

// The initial mapping: $DPE_CUDA_LOGICAL_DEVICES ("0,0,0": three logical devices on visible GPU 0), so that
// a test binary or the dpe tool can run multi-device code on one GPU without code changes; else identity.
std::vector<int> initial_mapping() {
  int count = physical_info().count;
  std::vector<int> mapping;
  const char* env = std::getenv("DPE_CUDA_LOGICAL_DEVICES");
  if (env == nullptr || *env == '\0' || count == 0) {
    for (int i = 0; i < count; ++i) mapping.push_back(i);
    return mapping;
  }
  std::stringstream list(env);
  for (std::string item; std::getline(list, item, ',');) {
    char* end = nullptr;
    long ordinal = std::strtol(item.c_str(), &end, 10);
    DPE_CHECK(!item.empty() && *end == '\0' && ordinal >= 0 && ordinal < count, "DPE_CUDA_LOGICAL_DEVICES='", env,
              "': '", item, "' is not a visible GPU ordinal (0..", count - 1, ")");
    mapping.push_back(static_cast<int>(ordinal));
    DPE_CHECK(mapping.size() <= static_cast<size_t>(kMaxLogicalDevices), "DPE_CUDA_LOGICAL_DEVICES: more than ",
              kMaxLogicalDevices, " logical devices");
  }
  return mapping;
}

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed, see the file comment
    for (int physical : initial_mapping()) reg->slots.emplace_back(physical);
    return reg;
  }();
  return *r;
}

// The slot of `logical`; freezes the mapping.
Slot& slot(int logical) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  int count = static_cast<int>(r.slots.size());
  DPE_CHECK(logical >= 0 && logical < count, "logical CUDA device ", logical, " does not exist: ",
            count == 0 ? ::dpe::detail::str_cat("no CUDA device is visible (", physical_info().unavailable_reason, ")")
                       : ::dpe::detail::str_cat(count, " logical CUDA devices (0..", count - 1, ")"));
  r.frozen = true;
  return r.slots[logical];
}

}  // namespace

int physical_device_count() { return physical_info().count; }

std::string unavailable_reason() { return physical_info().unavailable_reason; }

int logical_device_count() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return static_cast<int>(r.slots.size());
}

void set_logical_devices(const std::vector<int>& physical_ordinals) {
  int physical_count = physical_device_count();
  DPE_CHECK(!physical_ordinals.empty(),
            "set_logical_devices: the list of physical GPUs is empty (hide GPUs with CUDA_VISIBLE_DEVICES instead)");
  DPE_CHECK(physical_ordinals.size() <= static_cast<size_t>(kMaxLogicalDevices), "set_logical_devices: ",
            physical_ordinals.size(), " logical devices; expected at most ", kMaxLogicalDevices);
  for (size_t i = 0; i < physical_ordinals.size(); ++i) {
    int ordinal = physical_ordinals[i];
    DPE_CHECK(ordinal >= 0 && ordinal < physical_count, "set_logical_devices: physical GPU ", ordinal,
              " (for logical device cuda:", i, ") does not exist: ",
              physical_count == 0
                  ? ::dpe::detail::str_cat("no CUDA device is visible (", unavailable_reason(), ")")
                  : ::dpe::detail::str_cat(physical_count, " GPUs are visible (0..", physical_count - 1, ")"));
  }
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  DPE_CHECK(!r.frozen,
            "set_logical_devices must be called before any CUDA device is used (a stream, cuBLAS handle, "
            "allocation or copy already exists)");
  r.slots.clear();
  for (int ordinal : physical_ordinals) r.slots.emplace_back(ordinal);
}

int physical_device(int logical) { return slot(logical).physical; }

GpuInfo gpu_info(int logical) {
  DeviceGuard guard(logical);
  cudaDeviceProp prop{};
  DPE_CUDA_CHECK(cudaGetDeviceProperties(&prop, physical_device(logical)));
  GpuInfo info;
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  DPE_CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
}

bool can_access_peer(int a, int b) {
  int pa = physical_device(a), pb = physical_device(b);
  if (pa == pb) return true;
  int can = 0;
  DPE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, pa, pb));
  return can != 0;
}

cudaStream_t stream(int logical) {
  Slot& s = slot(logical);
  std::call_once(s.stream_once, [&] {
    DeviceGuard guard(logical);
    // Non-blocking: no implicit synchronisation with the legacy default stream; events order our streams.
    DPE_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  });
  return s.stream;
}

namespace {

// A library's handle of `logical`: made by `create` on the device at the first call, bound to its stream by
// `bind`, kept in `handle` for the process. Thread-safe (call_once).
template <typename Handle, typename Create, typename Bind>
Handle lazy_handle(int logical, std::once_flag& once, Handle& handle, Create create, Bind bind) {
  std::call_once(once, [&] {
    cudaStream_t st = stream(logical);
    DeviceGuard guard(logical);
    Handle made = nullptr;
    create(&made);
    bind(made, st);
    handle = made;
  });
  return handle;
}

}  // namespace

cublasHandle_t cublas_handle(int logical) {
  Slot& s = slot(logical);
  return lazy_handle(
      logical, s.cublas_once, s.cublas, [](cublasHandle_t* h) { DPE_CUBLAS_CHECK(cublasCreate(h)); },
      [](cublasHandle_t h, cudaStream_t st) { DPE_CUBLAS_CHECK(cublasSetStream(h, st)); });
}

cudnnHandle_t cudnn_handle(int logical) {
  Slot& s = slot(logical);
  return lazy_handle(
      logical, s.cudnn_once, s.cudnn, [](cudnnHandle_t* h) { DPE_CUDNN_CHECK(cudnnCreate(h)); },
      [](cudnnHandle_t h, cudaStream_t st) { DPE_CUDNN_CHECK(cudnnSetStream(h, st)); });
}

void synchronize(int logical) {
  cudaStream_t st = stream(logical);
  DeviceGuard guard(logical);
  DPE_CUDA_CHECK(cudaStreamSynchronize(st));
}

DeviceGuard::DeviceGuard(int logical) {
  int target = physical_device(logical);
  int current = -1;
  DPE_CUDA_CHECK(cudaGetDevice(&current));
  if (current != target) {
    DPE_CUDA_CHECK(cudaSetDevice(target));
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);  // unchecked: a destructor must not throw
}

}  // namespace dpe::cuda
