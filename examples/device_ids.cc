// Device-id configurations of DataParallel and what each gives, the mistakes included.
//
// On four logical CPU devices (set_num_cpu_devices(4)), builds DataParallel around a Linear(4, 2) with one
// configuration after another, runs one step on a small batch and prints "config -> result": the chunk
// sizes and the devices the batch actually used (DataParallel::last_step()), where DP gathers its outputs,
// or "config -> error: <message>" for a configuration DataParallel rejects: bad device lists at construction,
// before any worker thread starts; a batch too small for DDP at the step, before any work runs. With a GPU
// it adds a few CUDA configurations; without one it runs just the same.
//
//   bazel run //examples:device_ids
//
// The same checks from the command line, for one configuration:
//   bazel run //tools/dpe -- devices --device-ids cpu:0,cpu:1,cpu:2 --batch 5
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/ops.h"
#include "engine/data_parallel.h"
#include "layers/linear.h"
#include "layers/loss.h"

using namespace dpe;

std::string join(const std::vector<Device>& devices) {
  std::string s;
  for (const Device& d : devices) s += (s.empty() ? "" : " ") + d.str();
  return s;
}

// Builds DataParallel(Linear(4, 2) on `master`, options), runs one forward_backward on a batch of `batch`
// samples and prints what it did, or the error it threw.
void show(const std::string& config, DataParallelOptions options, int64_t batch, Device master = Device::cpu(0)) {
  std::printf("%-58s -> ", config.c_str());
  try {
    auto model = std::make_shared<nn::Linear>(4, 2);
    model->to(master);
    DataParallel dp(model, options);
    Tensor x = randn({batch, 4}), y = randn({batch, 2});  // on cpu:0: DataParallel copies the chunks over
    dp.forward_backward(x, y, [](const Tensor& out, const Tensor& target) {
      return nn::functional::mse_loss(out, target);
    });
    const StepReport& step = dp.last_step();
    std::printf("batch %lld: chunk sizes", static_cast<long long>(batch));
    for (int64_t s : step.chunk_sizes) std::printf(" %lld", static_cast<long long>(s));
    std::printf(" on %s (%zu of %zu devices)", join(step.used_devices).c_str(), step.used_devices.size(),
                dp.device_ids().size());
    if (options.mode == ParallelMode::DP) std::printf(", gathered on %s", dp.output_device().str().c_str());
    std::printf("\n");
  } catch (const Error& e) {
    std::printf("error: %s\n", e.what());
  }
}

int main() {
  set_num_cpu_devices(4);  // cpu:0..cpu:3 (or DPE_NUM_CPU_DEVICES; by default one per hardware thread)
  manual_seed(0);
  const std::vector<Device> cpu01 = {Device::cpu(0), Device::cpu(1)};
  const std::vector<Device> cpu0123 = all_devices(DeviceKind::CPU);
  std::printf("CPU devices: %s; CUDA devices: %d\n\n", join(cpu0123).c_str(), cuda_device_count());

  // Working configurations.
  // Default device_ids: every CUDA device when there is one, else every CPU device; the master must be on
  // the first of them.
  show("default device_ids", {}, 8, cuda_available() ? Device::cuda(0) : Device::cpu(0));
  show("device_ids cpu:0 cpu:1", {.device_ids = cpu01}, 8);
  show("device_ids cpu:0 cpu:1, output_device cpu:2", {.device_ids = cpu01, .output_device = Device::cpu(2)}, 8);
  // PyTorch's chunk rule: chunks of ceil(5 / 4) = 2, so only three devices get work.
  show("device_ids cpu:0..cpu:3, small batch", {.device_ids = cpu0123}, 5);
  show("device_ids cpu:0..cpu:3, small batch, Balanced split", {.device_ids = cpu0123, .split = SplitRule::Balanced},
       5);
  show("device_ids cpu:0..cpu:3, DDP", {.device_ids = cpu0123, .mode = ParallelMode::DDP}, 8);
  show("device_ids cpu:1 cpu:3 (master on cpu:1)", {.device_ids = std::vector<Device>{Device::cpu(1), Device::cpu(3)}},
       6, Device::cpu(1));
  // DDP with fewer samples than devices: cpu:3 gets none, runs nothing, and still takes part in the
  // all-reduce (with zeros), so the step is the batch's.
  show("device_ids cpu:0..cpu:3, DDP, batch of 3", {.device_ids = cpu0123, .mode = ParallelMode::DDP}, 3);

  // Rejected configurations: each error names the offending value.
  std::printf("\n");
  show("device_ids cpu:0 cpu:1 cpu:1 (duplicate)",
       {.device_ids = std::vector<Device>{Device::cpu(0), Device::cpu(1), Device::cpu(1)}}, 8);
  show("device_ids cpu:0 cpu:9 (no such device)", {.device_ids = std::vector<Device>{Device::cpu(0), Device::cpu(9)}},
       8);
  show("device_ids cpu:0 cuda:0 (mixed kinds)", {.device_ids = std::vector<Device>{Device::cpu(0), Device::cuda(0)}},
       8);
  show("device_ids {} (empty)", {.device_ids = std::vector<Device>{}}, 8);
  show("output_device cpu:9", {.device_ids = cpu01, .output_device = Device::cpu(9)}, 8);
  show("device_ids cpu:1 cpu:2, master on cpu:0",
       {.device_ids = std::vector<Device>{Device::cpu(1), Device::cpu(2)}}, 8);

  // CUDA configurations, only where there is a GPU.
  if (cuda_device_count() > 0) {
    std::printf("\n");
    const std::vector<Device> cuda_all = all_devices(DeviceKind::CUDA);
    show("device_ids " + join(cuda_all), {.device_ids = cuda_all}, 8, Device::cuda(0));
    show("device_ids " + join(cuda_all) + ", output_device cpu:0",
         {.device_ids = cuda_all, .output_device = Device::cpu(0)}, 8, Device::cuda(0));
    show("device_ids " + join(cuda_all) + ", master on cpu:0", {.device_ids = cuda_all}, 8);
    show("device_ids cuda:" + std::to_string(cuda_all.size()) + " (no such device)",
         {.device_ids = std::vector<Device>{Device::cuda(static_cast<int>(cuda_all.size()))}}, 8,
         Device::cuda(0));
  }
  return 0;
}
