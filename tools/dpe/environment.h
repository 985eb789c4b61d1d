// The environment variables the dpe tool and its libraries read, checked when a command starts (after its
// command line, before any work), so that a bad value is one line naming it and exit status 2, not a crash
// deep inside a library or an error after the data is loaded.
//
//   DPE_NUM_CPU_DEVICES    integer in [1, 1024] (core/device.h)
//   DPE_CPU_DEVICE_CORES   cores per CPU device, of this process's affinity mask (engine/worker_pool.h)
//   DPE_CPU_SGEMM          a float32 GEMM policy (core/kernels/sgemm_choice.h)
//   DPE_MAX_CPU_ISA        avx2, avx512, avx512_bf16 or native (core/cpu_isa.h)
//   OMP_NUM_THREADS        libgomp's (oneDNN's threads): integers in [1, 1024], comma-separated per nesting level;
//                          100000 made libgomp crash inside the first GEMM
//   OPENBLAS_NUM_THREADS   integer in [1, 1024] (the tool sets 1 where it is unset)
// DPE_CUDA_LOGICAL_DEVICES is checked where the CUDA devices are first listed (core/cuda/cuda_device.h), bench's
// DPE_PEAK_GFLOPS by bench itself. An empty value counts as unset, as the libraries read it.
#pragma once

namespace dpe::tool {

// Throws dpe::Error naming the variable, its value and what was expected.
void check_environment();

}  // namespace dpe::tool
