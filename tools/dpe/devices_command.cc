// dpe devices: lists the devices this build sees and checks a device-id configuration exactly as
// DataParallel does (same error messages), showing the chunk sizes a batch gets.
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "core/cpu_isa.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "engine/worker_pool.h"
#include "scatter_gather/chunking.h"
#include "tools/dpe/cli_util.h"
#include "tools/dpe/commands.h"
#include "tools/dpe/dist_option.h"

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
  std::printf("CPU instruction set: %s, OpenBLAS core %s; DPE_MAX_CPU_ISA=avx2|avx512|avx512_bf16 caps both\n",
              cpu_isa_description().c_str(), openblas_get_corename());
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
  std::string dist = "none";
};

// --dist mpi: every replica of every process of the launch, with its process's place. Each member gathers a
// line about itself from every member (one all-gather of fixed-size text), and process 0 prints them in global
// rank order. The place is MPI's, as the mpi backend exports it under torchrun's names.
void list_across_processes(const std::vector<Device>& devices, CollectiveBackend backend) {
  ProcessGroup group(devices, {.backend = backend});
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  auto env = [](const char* name) { const char* v = std::getenv(name); return std::string(v ? v : "?"); };
  constexpr int64_t kLength = 160;  // characters per line
  const int world = group.world_size(), local = group.size();
  std::vector<Tensor> lines(static_cast<size_t>(local));
  DeviceWorkerPool pool(devices);
  pool.run(static_cast<size_t>(local), [&](size_t r) {
    const std::string text = dpe::detail::str_cat(devices[r], " of process ", env("RANK"), " (local rank ", env("LOCAL_RANK"),
                                             " of ", env("LOCAL_WORLD_SIZE"), ") on ", host);
    std::vector<int64_t> chars(kLength, 0);
    std::copy_n(text.begin(), std::min<size_t>(text.size(), kLength - 1), chars.begin());
    const TensorOptions on_device = TensorOptions(DType::Int64).with_device(devices[r]);
    lines[r] = zeros({world * kLength}, on_device);
    group.all_gather_into_tensor(static_cast<int>(r), lines[r], Tensor::from_vector(chars, {kLength}, on_device));
  });
  if (group.global_rank(0) != 0) return;
  const std::vector<int64_t> all = lines[0].to_vector<int64_t>();
  std::printf("\nacross %d processes (--dist mpi): %d replicas, global rank = process x %d + local device index\n",
              world / local, world, local);
  for (int g = 0; g < world; ++g) {
    std::string text;
    for (int64_t i = g * kLength; i < (g + 1) * kLength && all[i] != 0; ++i) text.push_back(static_cast<char>(all[i]));
    std::printf("  replica %d: %s\n", g, text.c_str());
  }
}

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
  add_dist_option(*cmd, args->dist, "also list every replica of every process of an MPI launch with its process, "
                  "local rank and host (with --device-ids; process 0 prints)")
      ->needs(ids);
  cmd->callback([args] {
    if (args->dist != "none") {
      const std::vector<Device> devices = parse_device_option("--device-ids", *args->device_ids);
      check_device_ids("--device-ids", devices);
      return list_across_processes(devices, *dist_backend(args->dist, devices));
    }
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
