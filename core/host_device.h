// DPE_HOST_DEVICE marks small functions compiled for both the CPU and CUDA kernels (RNG, dtype
// conversion, activation math), so that both sides compute with literally the same code.
#pragma once

#if defined(__CUDACC__)
#define DPE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DPE_HOST_DEVICE inline
#endif
