// The host time of each cuDNN call a convolution makes, on its own: what core/kernels/conv_cuda.cu pays per
// call for descriptors, the workspace-size query, the convolution passes and the bias add. Each call runs
// --calls times in a loop on a tiny shape (1x1x4x4 input, 3x3 filter: the kernels' work is negligible and they
// queue up behind the host), the stream synchronised before the clock starts and before it stops. Where
// op_overhead_bench's conv2d row says what the whole op costs, this says which call it goes to. The last rows
// run the same forward convolution through cuDNN's graph API (the backend descriptors PyTorch's v8 path and
// cudnn-frontend use): an execution plan built once per shape, then one cudnnBackendExecute per call, with the
// variant pack (the call's pointers) built per call as PyTorch does, and kept. Whether those beat the legacy
// call is what decides if conv_cuda.cu should move to the graph API. Needs a CUDA device; without one (or in a
// CPU-only build) it says so and exits 0.
//
// Usage: bazel run //bench:cudnn_call_overhead_bench [-- --calls=20000]
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#if DPE_WITH_CUDA
#include <cuda_runtime.h>
#include <cudnn.h>

#include "core/cuda/cuda_check.h"
#include "core/error.h"
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

// A cuDNN graph-API descriptor, destroyed with its owner.
class BackendDesc {
 public:
  explicit BackendDesc(cudnnBackendDescriptorType_t type) { DPE_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  ~BackendDesc() { cudnnBackendDestroyDescriptor(d_); }
  BackendDesc(const BackendDesc&) = delete;
  BackendDesc& operator=(const BackendDesc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  template <typename T>
  BackendDesc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const T* values) {
    DPE_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
    return *this;
  }
  BackendDesc& set(cudnnBackendAttributeName_t name, const BackendDesc& other) {
    cudnnBackendDescriptor_t d = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
  }
  void finalize() { DPE_CUDNN_CHECK(cudnnBackendFinalize(d_)); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// A float32 NCHW tensor of the graph API, packed strides.
std::unique_ptr<BackendDesc> graph_tensor(int64_t uid, std::array<int64_t, 4> dims) {
  const std::array<int64_t, 4> strides = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
  const cudnnDataType_t type = CUDNN_DATA_FLOAT;
  const int64_t alignment = 16;
  auto t = std::make_unique<BackendDesc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data())
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  t->finalize();
  return t;
}

// The forward convolution of the legacy rows (x 1x1x4x4, w 1x1x3x3, padding 1) as a graph-API execution plan:
// the heuristics' (mode A) first engine configuration that finalizes. Any engine will do: the rows time the
// host's side of a call.
struct GraphConv {
  static constexpr int64_t kX = 'x', kW = 'w', kY = 'y';
  // Declared so that the plan goes first, then the configurations it was made from.
  std::unique_ptr<BackendDesc> x, w, y, conv, op, graph, heuristics;
  std::vector<std::unique_ptr<BackendDesc>> configs;
  std::unique_ptr<BackendDesc> plan;
  int64_t workspace_bytes = 0;

  explicit GraphConv(cudnnHandle_t handle) {
    x = graph_tensor(kX, {1, 1, 4, 4});
    w = graph_tensor(kW, {1, 1, 3, 3});
    y = graph_tensor(kY, {1, 1, 4, 4});
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t spatial = 2, ones[2] = {1, 1};
    conv = std::make_unique<BackendDesc>(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    conv->set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute)
        .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
        .set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial)
        .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, ones)
        .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, ones)
        .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, ones)
        .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, ones);
    conv->finalize();
    const float alpha = 1.0f, beta = 0.0f;
    op = std::make_unique<BackendDesc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, *x)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, *w)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, *y)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, *conv)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    op->finalize();
    graph = std::make_unique<BackendDesc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, *op).set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    graph->finalize();
    const cudnnBackendHeurMode_t heur_mode = CUDNN_HEUR_MODE_A;
    heuristics = std::make_unique<BackendDesc>(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heuristics->set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &heur_mode);
    heuristics->finalize();
    constexpr int64_t kMaxConfigs = 8;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < kMaxConfigs; ++i) {
      configs.push_back(std::make_unique<BackendDesc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(configs.back()->get());
    }
    int64_t returned = 0;
    DPE_CUDNN_CHECK(cudnnBackendGetAttribute(heuristics->get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxConfigs, &returned, raw.data()));
    for (int64_t i = 0; i < returned; ++i) {
      auto candidate = std::make_unique<BackendDesc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      candidate->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *configs[static_cast<size_t>(i)]);
      if (cudnnBackendFinalize(candidate->get()) != CUDNN_STATUS_SUCCESS) continue;
      int64_t got = 0;
      DPE_CUDNN_CHECK(cudnnBackendGetAttribute(candidate->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                               CUDNN_TYPE_INT64, 1, &got, &workspace_bytes));
      plan = std::move(candidate);
      return;
    }
    DPE_CHECK(false, "cuDNN's graph API: none of the heuristics' ", returned,
              " engine configurations finalizes a plan for the 1x1x4x4 convolution");
  }
};

// The call's pointers for one GraphConv execution.
std::unique_ptr<BackendDesc> variant_pack(void* x, void* w, void* y, void* workspace) {
  const int64_t uids[3] = {GraphConv::kX, GraphConv::kW, GraphConv::kY};
  void* pointers[3] = {x, w, y};
  auto pack = std::make_unique<BackendDesc>(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack->set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids)
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers)
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack->finalize();
  return pack;
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
  // The graph API: a plan is built once per shape (timed over 10 builds after the first), executed per call.
  GraphConv graph(handle);
  {
    constexpr int kBuilds = 10;
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < kBuilds; ++i) GraphConv rebuilt(handle);
    std::printf("%-58s %10.2f\n", "graph API: op graph, heuristics and plan (once per shape)",
                std::chrono::duration<double, std::micro>(Clock::now() - start).count() / kBuilds);
  }
  void* graph_ws = nullptr;
  if (graph.workspace_bytes > 0) DPE_CUDA_CHECK(cudaMalloc(&graph_ws, static_cast<size_t>(graph.workspace_bytes)));
  row("graph API: variant pack built per call + cudnnBackendExecute", [&] {
    auto pack = variant_pack(dx, dw, dy, graph_ws);
    DPE_CUDNN_CHECK(cudnnBackendExecute(handle, graph.plan->get(), pack->get()));
  });
  auto kept = variant_pack(dx, dw, dy, graph_ws);
  row("graph API: cudnnBackendExecute, variant pack kept",
      [&] { DPE_CUDNN_CHECK(cudnnBackendExecute(handle, graph.plan->get(), kept->get())); });
  if (graph_ws != nullptr) DPE_CUDA_CHECK(cudaFree(graph_ws));
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
