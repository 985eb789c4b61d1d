// dpe devices: lists the devices this build sees and checks a device-id configuration exactly as
// DataParallel does (same error messages), showing the chunk sizes a batch gets.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>

#include "engine/data_parallel.h"
#include "scatter_gather/chunking.h"
#include "tools/dpe/cli_util.h"
#include "tools/dpe/commands.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#endif

namespace dpe::tool {

namespace {

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

struct DevicesArgs {
  std::optional<std::string> device_ids, output_device;
  int64_t batch = 8;
  std::string split = "chunk";
};

void check_configuration(const DevicesArgs& args) {
  DataParallelOptions options;
  options.device_ids = parse_device_option("--device-ids", *args.device_ids);
  if (args.output_device) options.output_device = Device::parse(*args.output_device);
  options.split = args.split == "chunk" ? SplitRule::Chunk : SplitRule::Balanced;
  auto model = std::make_shared<Empty>();
  if (!options.device_ids->empty()) model->to((*options.device_ids)[0]);
  DataParallel dp(model, options);
  std::vector<int64_t> sizes = compute_chunk_sizes(args.batch, static_cast<int64_t>(dp.device_ids().size()), options.split);
  std::printf("\nconfiguration OK: device_ids = %s, output_device = %s\n", device_list_str(dp.device_ids()).c_str(),
              dp.output_device().str().c_str());
  std::printf("batch %lld, %s split: chunk sizes", static_cast<long long>(args.batch), args.split.c_str());
  for (int64_t s : sizes) std::printf(" %lld", static_cast<long long>(s));
  std::vector<Device> used(dp.device_ids().begin(), dp.device_ids().begin() + static_cast<int64_t>(sizes.size()));
  std::printf(" -> %zu of %zu devices used: %s\n", sizes.size(), dp.device_ids().size(), device_list_str(used).c_str());
  std::printf("DDP mode needs a batch of at least %zu (one sample per device)\n", dp.device_ids().size());
}

}  // namespace

void add_devices_command(CLI::App& app) {
  auto args = std::make_shared<DevicesArgs>();
  CLI::App* cmd = app.add_subcommand("devices", "List devices, memory and peer access; check a device-id configuration");
  CLI::Option* ids =
      cmd->add_option("--device-ids", args->device_ids, "comma-separated devices, e.g. cuda:0,cuda:1 or cpu:0,cpu:1");
  // The configuration options mean something only with a configuration to check.
  cmd->add_option("--output-device", args->output_device, "where DP gathers outputs (default: the first device id)")
      ->needs(ids);
  add_int_option(*cmd, "--batch", args->batch, "batch size whose chunk sizes to show", 0, int64_t{1} << 31)->needs(ids);
  cmd->add_option("--split", args->split, "split rule")->check(CLI::IsMember({"chunk", "balanced"}))->needs(ids);
  cmd->callback([args] {
    list_devices();
    if (args->device_ids) {
      try {
        check_configuration(*args);
      } catch (const Error& e) {
        throw Error(std::string("invalid configuration: ") + e.what());
      }
    }
  });
}

}  // namespace dpe::tool
