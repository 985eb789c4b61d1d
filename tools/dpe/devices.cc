// dpe devices: lists the devices this build sees, and checks a device-id configuration.
//
//   dpe_devices                                   # devices, memory, CUDA peer access
//   dpe_devices --device-ids cpu:0,cpu:1 --output-device cpu:0 --batch 5 [--split chunk|balanced]
//
// With --device-ids, it validates the list exactly as DataParallel does (same error messages) and prints
// the chunk sizes and used devices a batch of --batch items would get. Exit status 2 on a bad configuration.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "engine/data_parallel.h"
#include "layers/module.h"
#include "scatter_gather/chunking.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#endif

using namespace dpe;

namespace {

constexpr const char* kUsage =
    "usage: dpe_devices [--device-ids LIST] [--output-device DEVICE] [--batch N] [--split chunk|balanced]\n"
    "  LIST: comma-separated devices, e.g. cuda:0,cuda:1 or cpu:0,cpu:1\n"
    "  Without --device-ids: lists the devices. With it: validates the configuration like DataParallel\n"
    "  and shows the chunk sizes a batch of N items (default 8) gets.\n";

// A module without tensors: DataParallel's device checks need one.
class Empty : public nn::Cloneable<Empty> {
 public:
  Empty() : Cloneable("Empty") {}
};

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

void list_devices() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  std::printf("CPU devices: %d logical (DPE_NUM_CPU_DEVICES or set_num_cpu_devices), host memory %.1f GiB shared\n",
              num_cpu_devices(), gib(static_cast<double>(pages) * page));
  for (const Device& d : all_devices(DeviceKind::CPU)) std::printf("  %s\n", d.str().c_str());
  int n = cuda_device_count();
#if DPE_WITH_CUDA
  if (n == 0) {
    std::printf("CUDA devices: none (%s)\n", cuda::unavailable_reason().c_str());
    return;
  }
  std::printf("CUDA devices: %d (visible ordinals, after CUDA_VISIBLE_DEVICES)\n", n);
  for (int i = 0; i < n; ++i) {
    cuda::GpuInfo info = cuda::gpu_info(i);
    std::printf("  cuda:%d  %s  sm_%d%d  %.1f GiB total, %.1f GiB free  (physical %d)\n", i, info.name.c_str(),
                info.compute_major, info.compute_minor, gib(static_cast<double>(info.total_bytes)),
                gib(static_cast<double>(info.free_bytes)), cuda::physical_device(i));
  }
  if (n > 1) {
    std::printf("peer access (row can read column):\n      ");
    for (int j = 0; j < n; ++j) std::printf(" cuda:%d", j);
    std::printf("\n");
    for (int i = 0; i < n; ++i) {
      std::printf("cuda:%d", i);
      for (int j = 0; j < n; ++j) std::printf("  %5s", i == j ? "-" : (cuda::can_access_peer(i, j) ? "yes" : "no"));
      std::printf("\n");
    }
  }
#else
  std::printf("CUDA devices: %d (this dpe build has no CUDA support)\n", n);
#endif
}

std::vector<Device> parse_device_list(const std::string& list) {
  std::vector<Device> devices;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) devices.push_back(Device::parse(item));
  }
  return devices;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<std::string> device_ids, output_device;
  int64_t batch = 8;
  SplitRule split = SplitRule::Chunk;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      auto value = [&]() -> std::string {
        DPE_CHECK(i + 1 < argc, arg, " needs a value");
        return argv[++i];
      };
      if (arg == "--help" || arg == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (arg == "--device-ids") {
        device_ids = value();
      } else if (arg == "--output-device") {
        output_device = value();
      } else if (arg == "--batch") {
        std::string v = value();
        char* end = nullptr;
        batch = std::strtoll(v.c_str(), &end, 10);
        DPE_CHECK(*end == '\0' && batch >= 0, "--batch ", v, ": expected a non-negative integer");
      } else if (arg == "--split") {
        std::string v = value();
        DPE_CHECK(v == "chunk" || v == "balanced", "--split ", v, ": expected chunk or balanced");
        split = v == "chunk" ? SplitRule::Chunk : SplitRule::Balanced;
      } else {
        DPE_CHECK(false, "unknown argument '", arg, "'");
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "dpe_devices: %s\n%s", e.what(), kUsage);
    return 2;
  }

  try {
    list_devices();
    if (!device_ids) return 0;
    DataParallelOptions options;
    options.device_ids = parse_device_list(*device_ids);
    if (output_device) options.output_device = Device::parse(*output_device);
    options.split = split;
    auto model = std::make_shared<Empty>();
    if (!options.device_ids->empty()) model->to((*options.device_ids)[0]);
    DataParallel dp(model, options);
    std::vector<int64_t> sizes = compute_chunk_sizes(batch, static_cast<int64_t>(dp.device_ids().size()), split);
    std::printf("\nconfiguration OK: device_ids =");
    for (const Device& d : dp.device_ids()) std::printf(" %s", d.str().c_str());
    std::printf(", output_device = %s\n", dp.output_device().str().c_str());
    std::printf("batch %lld, %s split: chunk sizes", static_cast<long long>(batch), split_rule_name(split).c_str());
    for (int64_t s : sizes) std::printf(" %lld", static_cast<long long>(s));
    std::printf(" -> %zu of %zu devices used:", sizes.size(), dp.device_ids().size());
    for (size_t i = 0; i < sizes.size(); ++i) std::printf(" %s", dp.device_ids()[i].str().c_str());
    std::printf("\n");
  } catch (const Error& e) {
    std::fprintf(stderr, "\ninvalid configuration: %s\n", e.what());
    return 2;
  }
  return 0;
}
