// The peak FLOP/s that model FLOPs utilisation (MFU, PaLM's definition: the FLOPs a step's model needs per
// second, over the hardware's peak) is measured against. CUDA devices: the vendors' dense peaks by device name
// and compute precision (a table, no measurement); CPU devices: the FMA probe of every CPU at once
// (core/fma_peak.h), which the CPU devices share. DPE_PEAK_GFLOPS overrides both (a machine the table does not
// know, or a figure of the user's own).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"

namespace dpe {

// The arithmetic a step's products run in: FP32 (dpe's CUDA float32 GEMMs are true FP32, never TF32), TF32,
// BF16 (bfloat16 or float16 tensor cores: the same dense rate on the GPUs below).
enum class ComputePrecision { FP32, TF32, BF16 };
const char* compute_precision_name(ComputePrecision precision);

// One GPU's dense peak in TFLOP/s from its CUDA name ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H100
// PCIe", ...): H100 SXM and H200 989.4 BF16, 494.7 TF32, 66.9 FP32; H100/H200 NVL 835.5, 417.5, 60.0; H100
// PCIe 756.5, 378.0, 51.2; A100 312, 156, 19.5 (NVIDIA's datasheets, without sparsity). nullopt for any other.
std::optional<double> gpu_peak_tflops(const std::string& name, ComputePrecision precision);

// DPE_PEAK_GFLOPS when set (a finite positive number, else an error naming it); nullopt otherwise.
std::optional<double> peak_gflops_override();

struct PeakFlops {
  double gflops = 0;   // every device together (across processes: times the processes)
  std::string source;  // how it was found: "DPE_PEAK_GFLOPS", "2 x NVIDIA H200 BF16 table", "AVX-512 FMA probe ..."
};

// The peak of `devices` (one kind) working together in `precision`, times `processes` (each taken to have as
// many and as fast: process 0 reports). nullopt for a GPU the table does not know (then DPE_PEAK_GFLOPS). CPU
// devices share the machine's cores: the probe of every CPU of this process's affinity mask, whatever their
// count, float32 FMAs whatever the precision (CPU bf16 products run on other units; a share above 100% says so).
std::optional<PeakFlops> peak_flops(const std::vector<Device>& devices, ComputePrecision precision,
                                    int64_t processes = 1);

}  // namespace dpe
