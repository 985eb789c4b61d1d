// A CUDA kernel that writes through an address no allocation holds, for tests of what dpe does after a sticky
// CUDA error (engine/sticky_cuda_error_test.cc). The error it raises, cudaErrorIllegalAddress, is sticky: every
// later call in the CUDA context of that GPU fails with it, for the life of the process.
#pragma once

#include "core/kernels/backend_types.h"

namespace dpe::testing {

// Enqueues the faulting kernel on `stream` (a stream of the current GPU). Returns at once; the error shows at
// the next call that waits for the GPU. Only in CUDA builds (the library is empty otherwise).
void launch_illegal_write(cudaStream_t stream);

}  // namespace dpe::testing
