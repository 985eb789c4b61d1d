#include "core/peak_flops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "core/fma_peak.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#endif

namespace dpe {

const char* compute_precision_name(ComputePrecision precision) {
  switch (precision) {
    case ComputePrecision::FP32: return "FP32";
    case ComputePrecision::TF32: return "TF32";
    case ComputePrecision::BF16: return "BF16";
  }
  return "?";
}

std::optional<double> gpu_peak_tflops(const std::string& name, ComputePrecision precision) {
  struct Entry {
    const char* model;  // matched in the name; the more specific entries first
    double bf16, tf32, fp32;
  };
  static constexpr Entry kTable[] = {
      {"H200 NVL", 835.5, 417.5, 60.0}, {"H100 NVL", 835.5, 417.5, 60.0}, {"H100 PCIe", 756.5, 378.0, 51.2},
      {"H200", 989.4, 494.7, 66.9},     {"H100", 989.4, 494.7, 66.9},     {"A100", 312.0, 156.0, 19.5},
  };
  for (const Entry& e : kTable) {
    if (name.find(e.model) == std::string::npos) continue;
    switch (precision) {
      case ComputePrecision::FP32: return e.fp32;
      case ComputePrecision::TF32: return e.tf32;
      case ComputePrecision::BF16: return e.bf16;
    }
  }
  return std::nullopt;
}

std::optional<double> peak_gflops_override() {
  const char* env = std::getenv("DPE_PEAK_GFLOPS");
  if (env == nullptr) return std::nullopt;
  char* end = nullptr;
  const double gflops = std::strtod(env, &end);
  DPE_CHECK(*env != '\0' && *end == '\0' && std::isfinite(gflops) && gflops > 0, "DPE_PEAK_GFLOPS='", env,
            "' is not a positive number of GFLOP/s (the peak of every device together; unset it to measure the CPU's "
            "or look up the GPU's)");
  return gflops;
}

namespace {

std::string fixed1(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", value);
  return text;
}

std::string processes_suffix(int64_t processes, double gflops) {
  if (processes <= 1) return "";
  return detail::str_cat(", x ", processes, " processes (process 0's) = ", fixed1(gflops * static_cast<double>(processes)),
                         " GFLOP/s");
}

std::optional<PeakFlops> gpu_peak(const std::vector<Device>& devices, ComputePrecision precision, int64_t processes) {
#if DPE_WITH_CUDA
  double gflops = 0;
  std::string names;
  for (const Device& d : devices) {
    const std::string name = cuda::gpu_info(d.index).name;
    const std::optional<double> tflops = gpu_peak_tflops(name, precision);
    if (!tflops) return std::nullopt;
    gflops += *tflops * 1e3;
    if (names.find(name) == std::string::npos) names += (names.empty() ? "" : ", ") + name;
  }
  return PeakFlops{gflops * static_cast<double>(processes),
                   detail::str_cat(devices.size(), " x ", names, " ", compute_precision_name(precision),
                                   " (datasheet): ", fixed1(gflops), " GFLOP/s", processes_suffix(processes, gflops))};
#else
  (void)devices;
  (void)precision;
  (void)processes;
  return std::nullopt;
#endif
}

PeakFlops cpu_peak(int64_t processes) {
  const MachinePeak peak = probe_fma_peak_every_cpu();
  const auto [slowest, fastest] = std::minmax_element(peak.per_cpu.begin(), peak.per_cpu.end());
  std::string source =
      peak.cpus.size() == 1
          ? detail::str_cat(peak.isa, " FMA probe on 1 CPU: ", fixed1(peak.gflops), " GFLOP/s")
          : detail::str_cat(peak.isa, " FMA probe on ", peak.cpus.size(), " CPUs at once: ", fixed1(*slowest), "-",
                            fixed1(*fastest), " GFLOP/s each, ", fixed1(peak.gflops), " GFLOP/s");
  return {peak.gflops * static_cast<double>(processes), source + processes_suffix(processes, peak.gflops)};
}

}  // namespace

std::optional<PeakFlops> peak_flops(const std::vector<Device>& devices, ComputePrecision precision,
                                    int64_t processes) {
  DPE_CHECK(!devices.empty(), "peak_flops: no devices");
  if (const std::optional<double> gflops = peak_gflops_override()) {
    return PeakFlops{*gflops, detail::str_cat(fixed1(*gflops), " GFLOP/s from DPE_PEAK_GFLOPS")};
  }
  if (devices[0].is_cuda()) return gpu_peak(devices, precision, processes);
  return cpu_peak(processes);
}

}  // namespace dpe
