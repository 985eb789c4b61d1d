// Process-wide backend switches, named after PyTorch's torch.backends.
//
// cudnn::benchmark (torch.backends.cudnn.benchmark): false (the default) chooses each convolution's cuDNN
// algorithm from cuDNN's heuristics, deterministic algorithms first, so a step repeats bit for bit; true
// times every algorithm once per shape and device (cudnnFind*AlgorithmEx) and keeps the fastest,
// nondeterministic ones included (Note [cuDNN algorithm choice], core/kernels/conv_cuda.cu). No effect on
// CPU devices. The deterministic mode (engine/data_parallel.h) refuses CUDA devices while it is on.
//
// Thread-safety: any thread may read or set it; a convolution reads it once, when it starts, and each
// setting keeps its own choices (turning it off goes back to the heuristics' algorithms).
#pragma once

namespace dpe::backends::cudnn {

void set_benchmark(bool on);
bool benchmark();

}  // namespace dpe::backends::cudnn
