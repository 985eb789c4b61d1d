#include <cstdint>

#include "core/cuda/cuda_check.h"
#include "tests/testing/cuda_fault.h"

namespace dpe::testing {
namespace {

// Address 16: in the page no CUDA allocation ever holds.
__global__ void illegal_write(int* p) { *p = 1; }

}  // namespace

void launch_illegal_write(cudaStream_t stream) {
  illegal_write<<<1, 1, 0, stream>>>(reinterpret_cast<int*>(uintptr_t{16}));
  DPE_CUDA_CHECK_LAUNCH();
}

}  // namespace dpe::testing
