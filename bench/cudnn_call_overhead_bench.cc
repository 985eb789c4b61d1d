// The host time of each cuDNN call a convolution makes, on its own: what core/kernels/conv_cuda.cu pays per
// call for descriptors, the workspace-size query, the convolution passes and the bias add. Each call runs
// --calls times in a loop on a tiny shape (1x1x4x4 input, 3x3 filter: the kernels' work is negligible and they
// queue up behind the host), the stream synchronised before the clock starts and before it stops. Where
// op_overhead_bench's conv2d row says what the whole op costs, this says which call it goes to. Needs a CUDA
// device; without one (or in a CPU-only build) it says so and exits 0.
//
// Usage: bazel run //bench:cudnn_call_overhead_bench [-- --calls=20000]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#if DPE_WITH_CUDA
#include <cuda_runtime.h>
#include <cudnn.h>

#include "core/cuda/cuda_check.h"
#endif

namespace {

#if DPE_WITH_CUDA
using Clock = std::chrono::steady_clock;

double us_per_call(cudaStream_t stream, int calls, const std::function<void()>& call) {
  for (int i = 0; i < 100; ++i) call();
  DPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < calls; ++i) call();
  DPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / calls;
}

int run(int calls) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cudnn_call_overhead_bench: no CUDA device; nothing to measure\n");
    return 0;
  }
  DPE_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t stream = nullptr;
  DPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudnnHandle_t handle = nullptr;
  DPE_CUDNN_CHECK(cudnnCreate(&handle));
  DPE_CUDNN_CHECK(cudnnSetStream(handle, stream));

  // conv_cuda.cu's descriptors for x (1, 1, 4, 4), w (1, 1, 3, 3), padding 1: y (1, 1, 4, 4), bias (1, 1, 1, 1).
  cudnnTensorDescriptor_t x, y, bias;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  auto create = [&] {
    DPE_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    DPE_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    DPE_CUDNN_CHECK(cudnnCreateTensorDescriptor(&bias));
    DPE_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    DPE_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    DPE_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, 4, 4));
    DPE_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, 4, 4));
    DPE_CUDNN_CHECK(cudnnSetTensor4dDescriptor(bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, 1, 1));
    DPE_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 1, 1, 3, 3));
    DPE_CUDNN_CHECK(
        cudnnSetConvolution2dDescriptor(conv, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DPE_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH));
  };
  auto destroy = [&] {
    cudnnDestroyTensorDescriptor(x);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyTensorDescriptor(bias);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyConvolutionDescriptor(conv);
  };
  float *dx = nullptr, *dw = nullptr, *dy = nullptr, *db = nullptr;
  DPE_CUDA_CHECK(cudaMalloc(&dx, 16 * sizeof(float)));
  DPE_CUDA_CHECK(cudaMalloc(&dy, 16 * sizeof(float)));
  DPE_CUDA_CHECK(cudaMalloc(&dw, 9 * sizeof(float)));
  DPE_CUDA_CHECK(cudaMalloc(&db, sizeof(float)));
  const float one = 1.0f, zero = 0.0f;

  std::printf("# cuDNN %zu, host microseconds per call, %d calls, x 1x1x4x4, w 1x1x3x3, float32\n",
              cudnnGetVersion(), calls);
  std::printf("%-58s %10s\n", "call", "us/call");
  auto row = [&](const char* name, const std::function<void()>& call) {
    std::printf("%-58s %10.2f\n", name, us_per_call(stream, calls, call));
  };
  row("create, set and destroy the 5 descriptors", [&] {
    create();
    destroy();
  });
  create();
  row("cudnnSetStream", [&] { DPE_CUDNN_CHECK(cudnnSetStream(handle, stream)); });
  cudnnConvolutionFwdAlgoPerf_t fwd_perf[16];
  cudnnConvolutionBwdDataAlgoPerf_t data_perf[16];
  cudnnConvolutionBwdFilterAlgoPerf_t filter_perf[16];
  int got = 0;
  row("cudnnGetConvolutionForwardAlgorithm_v7 (up to 16)", [&] {
    DPE_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, x, w, conv, y, 16, &got, fwd_perf));
  });
  DPE_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, w, y, conv, x, 16, &got, data_perf));
  DPE_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, x, y, conv, w, 16, &got, filter_perf));
  const cudnnConvolutionFwdAlgo_t fwd = fwd_perf[0].algo;
  const cudnnConvolutionBwdDataAlgo_t data = data_perf[0].algo;
  const cudnnConvolutionBwdFilterAlgo_t filter = filter_perf[0].algo;
  std::printf("# algorithms: forward %d, backward data %d, backward filter %d (the heuristics' first)\n",
              static_cast<int>(fwd), static_cast<int>(data), static_cast<int>(filter));
  size_t bytes = 0;
  row("cudnnGetConvolutionForwardWorkspaceSize",
      [&] { DPE_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle, x, w, conv, y, fwd, &bytes)); });
  // The passes run without workspace where the heuristics' first algorithm needs none; otherwise one block
  // as large as the largest of the three, allocated once.
  size_t ws_bytes = fwd_perf[0].memory;
  if (data_perf[0].memory > ws_bytes) ws_bytes = data_perf[0].memory;
  if (filter_perf[0].memory > ws_bytes) ws_bytes = filter_perf[0].memory;
  void* ws = nullptr;
  if (ws_bytes > 0) DPE_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  row("cudnnConvolutionForward", [&] {
    DPE_CUDNN_CHECK(cudnnConvolutionForward(handle, &one, x, dx, w, dw, conv, fwd, ws, ws_bytes, &zero, y, dy));
  });
  row("cudnnAddTensor (the bias)", [&] { DPE_CUDNN_CHECK(cudnnAddTensor(handle, &one, bias, db, &one, y, dy)); });
  row("cudnnConvolutionBackwardData", [&] {
    DPE_CUDNN_CHECK(
        cudnnConvolutionBackwardData(handle, &one, w, dw, y, dy, conv, data, ws, ws_bytes, &zero, x, dx));
  });
  row("cudnnConvolutionBackwardFilter", [&] {
    DPE_CUDNN_CHECK(
        cudnnConvolutionBackwardFilter(handle, &one, x, dx, y, dy, conv, filter, ws, ws_bytes, &zero, w, dw));
  });
  row("cudnnConvolutionBackwardBias", [&] {
    DPE_CUDNN_CHECK(cudnnConvolutionBackwardBias(handle, &one, y, dy, &zero, bias, db));
  });
  destroy();
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dy), static_cast<void*>(dw), static_cast<void*>(db), ws}) {
    if (p != nullptr) DPE_CUDA_CHECK(cudaFree(p));
  }
  DPE_CUDNN_CHECK(cudnnDestroy(handle));
  DPE_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
#else
int run(int) {
  std::printf("cudnn_call_overhead_bench: built without CUDA; nothing to measure\n");
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  int calls = 20000;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--calls=", 8) == 0 && std::atoi(argv[i] + 8) > 0) {
      calls = std::atoi(argv[i] + 8);
    } else {
      std::fprintf(stderr, "cudnn_call_overhead_bench: unknown argument '%s' (expected --calls=N, N > 0)\n", argv[i]);
      return 2;
    }
  }
  try {
    return run(calls);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cudnn_call_overhead_bench: %s\n", e.what());
    return 1;
  }
}
