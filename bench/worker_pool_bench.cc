// What a DeviceWorkerPool::run costs beyond its tasks: the hand-over (from the call to each worker starting
// its task) and the return (from the last task's end to run() returning), the two waits every DP phase and
// every DDP step pays once per run. Each task busy-works a given time (a stand-in for a replica's forward or
// backward) and, between runs, the caller busy-works a gap (DP's loss, gather and optimizer step on the
// caller's thread), so the workers wait for the next run as they do in training.
//
// Usage: bazel run //bench:worker_pool_bench [-- --devices=2 --runs=2000]
// Prints, per (task, gap): the median and 90th percentile of the hand-over and the return in microseconds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "engine/worker_pool.h"

namespace {

using Clock = std::chrono::steady_clock;
using dpe::Device;
using dpe::DeviceWorkerPool;

// Keeps the calling thread's core busy for `us` microseconds, as a kernel would (no yielding).
void busy_for(double us) {
  const Clock::time_point end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double, std::micro>(us));
  while (Clock::now() < end) {
  }
}

double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(p * static_cast<double>(values.size() - 1))];
}

void measure(DeviceWorkerPool& pool, int runs, double task_us, double gap_us) {
  const size_t n = pool.size();
  std::vector<Clock::time_point> started(n), ended(n);
  std::vector<double> hand_over, back;
  for (int r = 0; r < runs + runs / 10; ++r) {
    busy_for(gap_us);
    const Clock::time_point call = Clock::now();
    pool.run(n, [&](size_t i) {
      started[i] = Clock::now();
      busy_for(task_us);
      ended[i] = Clock::now();
    });
    const Clock::time_point returned = Clock::now();
    if (r < runs / 10) continue;  // warm-up
    hand_over.push_back(us_between(call, *std::max_element(started.begin(), started.end())));
    back.push_back(us_between(*std::max_element(ended.begin(), ended.end()), returned));
  }
  std::printf("%9.0f %9.0f | %9.1f %9.1f | %9.1f %9.1f\n", task_us, gap_us, percentile(hand_over, 0.5),
              percentile(hand_over, 0.9), percentile(back, 0.5), percentile(back, 0.9));
}

int run(int argc, char** argv) {
  int devices = 2, runs = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--devices=")) {
      devices = std::atoi(argv[i] + 10);
      DPE_CHECK(devices > 0, "--devices=", arg.substr(10), ": expected a positive number of CPU devices");
    } else if (arg.starts_with("--runs=")) {
      runs = std::atoi(argv[i] + 7);
      DPE_CHECK(runs >= 10, "--runs=", arg.substr(7), ": expected at least 10 runs");
    } else {
      DPE_CHECK(false, "unknown argument '", arg, "' (expected --devices=N or --runs=N)");
    }
  }
  std::vector<Device> ids;
  for (int i = 0; i < devices; ++i) ids.push_back(Device::cpu(i));
  DeviceWorkerPool pool(ids);
  std::printf("# DeviceWorkerPool::run on %d CPU devices, %d usable cores, %d runs per row: microseconds\n",
              devices, dpe::usable_cores(), runs);
  std::printf("%9s %9s | %9s %9s | %9s %9s\n", "task us", "gap us", "handover", "p90", "return", "p90");
  for (double task : {0.0, 50.0, 2000.0}) {
    for (double gap : {0.0, 50.0, 200.0}) measure(pool, task >= 2000.0 ? runs / 4 : runs, task, gap);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker_pool_bench: %s\n", e.what());
    return 1;
  }
}
