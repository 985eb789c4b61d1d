// CUDA 2-d convolution on cuDNN (core/kernels/conv.h): cudnnConvolutionForward (+ cudnnAddTensor for the
// bias), cudnnConvolutionBackwardData, cudnnConvolutionBackwardFilter, NCHW float32 / float64, groups;
// bfloat16 / float16 operands for autocast (Note [16-bit convolutions]).
//
// Note [cuDNN algorithm choice]
// For each (pass, device, shape) the algorithm is chosen once and cached with the call's descriptors (Plan,
// below; a training loop hits the same shapes every step), in one of two ways (core/backends.h,
// backends::cudnn::benchmark):
//   - heuristics (the default): from cudnnGet*Algorithm_v7's ranked list, the first entry that cuDNN
//     reports as usable (status success), is deterministic (cuDNN's atomics-based backward-filter
//     algorithms are not) and does not use tensor cores (FMA math: no TF32 rounding of float32 inputs)
//     wins; if none is deterministic, the first usable FMA one. So float32 results compare with the CPU's
//     to summation-order error, a step repeats bit for bit on one GPU, and the choice is free of timing noise
//     and of the memory Find allocates.
//   - benchmark (torch.backends.cudnn.benchmark = True): cudnnFind*AlgorithmEx runs every algorithm on the
//     call's own inputs, into a scratch output (the caller's is left alone), with a workspace as large as
//     the largest the heuristics list asks for (at most kFindWorkspaceCap), and the fastest usable FMA one
//     wins, deterministic or not. The first call of a shape synchronises the device's stream.
// 16-bit operands may use tensor cores in both (their inputs are already 16-bit, nothing is rounded to
// TF32): the rules are the same without the FMA condition.
//
// Note [16-bit convolutions]
// conv.h's contract for bfloat16 / float16 operands is float32 outputs. cuDNN's legacy API wants x, w and y
// in one type (its PSEUDO_HALF / PSEUDO_BFLOAT16 configurations: 16-bit data, float32 compute type), so
// each pass writes a 16-bit result into a scratch block and one conversion (copy_cuda) widens it into the
// float32 output; the bias is then added in float32. The result is the float32 accumulation rounded once
// to the operand type, which is what PyTorch's CUDA autocast returns.
//
// Workspace comes from the device's caching allocator and is released right after the call is enqueued:
// every kernel of a device runs on its one stream, so a later user of the block runs after this call
// (core/allocator.h). The device's cuDNN handle (cuda::cudnn_handle) is set to `stream` on every call.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/allocator.h"
#include "core/backends.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_device.h"
#include "core/device.h"
#include "core/kernels/conv.h"
#include "core/kernels/copy.h"
#include "core/kernels/layout.h"

namespace dpe::kernels {
namespace {

bool is_16bit(DType dtype) { return dtype == DType::BFloat16 || dtype == DType::Float16; }

cudnnDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::Float64: return CUDNN_DATA_DOUBLE;
    case DType::BFloat16: return CUDNN_DATA_BFLOAT16;
    case DType::Float16: return CUDNN_DATA_HALF;
    default: return CUDNN_DATA_FLOAT;
  }
}

// cuDNN's descriptors take int sizes.
int to_int(int64_t v, const char* what) {
  DPE_CHECK(v <= INT32_MAX, what, ": size ", v, " does not fit cuDNN's int");
  return static_cast<int>(v);
}

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { DPE_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d)); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc() { DPE_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d)); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc() { DPE_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d)); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

// x: (N, C_in, H, W)  y: (N, C_out, H_out, W_out)  w: (C_out, C_in/g, kH, kW), all in the operand type;
// y_out (y's shape) and bias (1, C_out, 1, 1) in the output type (conv2d_output_dtype).
struct Descriptors {
  TensorDesc x, y, y_out, bias;
  FilterDesc w;
  ConvDesc conv;

  Descriptors(const char* what, const Conv2dShape& s) {
    const cudnnDataType_t t = data_type(s.dtype), out = data_type(conv2d_output_dtype(s.dtype));
    DPE_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x.d, CUDNN_TENSOR_NCHW, t, to_int(s.n, what), to_int(s.c_in, what),
                                               to_int(s.h, what), to_int(s.w, what)));
    for (TensorDesc* d : {&y, &y_out}) {
      DPE_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d->d, CUDNN_TENSOR_NCHW, d == &y ? t : out, to_int(s.n, what),
                                                 to_int(s.c_out, what), to_int(s.h_out(), what),
                                                 to_int(s.w_out(), what)));
    }
    DPE_CUDNN_CHECK(cudnnSetTensor4dDescriptor(bias.d, CUDNN_TENSOR_NCHW, out, 1, to_int(s.c_out, what), 1, 1));
    DPE_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.d, t, CUDNN_TENSOR_NCHW, to_int(s.c_out, what),
                                               to_int(s.c_in / s.groups, what), to_int(s.kh, what),
                                               to_int(s.kw, what)));
    DPE_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv.d, to_int(s.pad_h, what), to_int(s.pad_w, what),
                                                    to_int(s.stride_h, what), to_int(s.stride_w, what),
                                                    to_int(s.dil_h, what), to_int(s.dil_w, what),
                                                    CUDNN_CROSS_CORRELATION, out));
    DPE_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.d, to_int(s.groups, what)));
    DPE_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.d, CUDNN_FMA_MATH));
  }
};

// Device memory from the device's caching allocator for one call's workspace (see the file comment).
class Workspace {
 public:
  Workspace(int device, size_t nbytes)
      : allocator_(allocator_for(Device::cuda(device))),
        nbytes_(nbytes),
        ptr_(nbytes > 0 ? allocator_.allocate(nbytes) : nullptr) {}
  ~Workspace() {
    if (ptr_ != nullptr) allocator_.deallocate(ptr_, nbytes_);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return ptr_; }
  size_t size() const { return nbytes_; }

 private:
  CachingAllocator& allocator_;
  size_t nbytes_;
  void* ptr_;
};

enum class Pass : int { Forward, BackwardData, BackwardFilter };

// The algorithm of Note [cuDNN algorithm choice], as an int (the three enum types differ), and its math.
struct Choice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_FMA_MATH;
};

// (pass, benchmark, device, dtype, shape)
using Key = std::tuple<int, bool, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

Key key_of(Pass pass, bool benchmark, int device, const Conv2dShape& s) {
  return {static_cast<int>(pass), benchmark, device,     static_cast<int>(s.dtype), s.n,      s.c_in,
          s.h,                    s.w,       s.c_out,    s.kh,                      s.kw,     s.stride_h,
          s.stride_w,             s.pad_h,   s.pad_w,    s.dil_h,                   s.dil_w,  s.groups};
}

bool is_tensor_op(cudnnMathType_t m) {
  return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// Picks from cuDNN's ranked perf results (any of the three Perf structs); tensor cores only for 16-bit data.
template <typename Perf>
Choice pick(const char* what, const std::vector<Perf>& perf, int returned, bool allow_tensor_ops,
            bool prefer_deterministic) {
  const Perf* fallback = nullptr;
  for (int i = 0; i < returned; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || (!allow_tensor_ops && is_tensor_op(p.mathType))) continue;
    if (!prefer_deterministic || p.determinism == CUDNN_DETERMINISTIC) return {static_cast<int>(p.algo), p.mathType};
    if (fallback == nullptr) fallback = &p;
  }
  DPE_CHECK(fallback != nullptr, what, ": cuDNN offers no usable ",
            allow_tensor_ops ? "" : "non-tensor-core ", "algorithm for this shape (", returned, " candidates)");
  return {static_cast<int>(fallback->algo), fallback->mathType};
}

// The largest workspace Find may use: more only lets it try algorithms that trade memory for little speed.
constexpr size_t kFindWorkspaceCap = size_t{1} << 30;

template <typename Perf>
size_t largest_workspace(const std::vector<Perf>& perf, int returned) {
  size_t bytes = 0;
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS) bytes = std::max(bytes, perf[i].memory);
  }
  return std::min(bytes, kFindWorkspaceCap);
}

// What Find runs a pass on: forward (x, w -> y), backward data (w, dy -> dx), backward filter (x, dy -> dw);
// out_numel is the output's element count, written to a scratch block in the operand type.
struct FindInputs {
  const void* a = nullptr;
  const void* b = nullptr;
  int64_t out_numel = 0;
};

// One pass's heuristics list, and with `find` set its measured one (then `perf` holds Find's results).
template <typename Perf, typename Heuristics, typename Measure>
Choice rank(const char* what, int device, const Conv2dShape& s, const FindInputs* find, int count,
            Heuristics heuristics, Measure measure) {
  const bool tensor_ops = is_16bit(s.dtype);
  std::vector<Perf> perf(count);
  int returned = 0;
  DPE_CUDNN_CHECK(heuristics(count, &returned, perf.data()));
  if (find == nullptr) return pick(what, perf, returned, tensor_ops, /*prefer_deterministic=*/true);
  Workspace out(device, static_cast<size_t>(find->out_numel) * element_size(s.dtype));
  Workspace ws(device, largest_workspace(perf, returned));
  DPE_CUDNN_CHECK(measure(out.get(), count, &returned, perf.data(), ws.get(), ws.size()));
  return pick(what, perf, returned, tensor_ops, /*prefer_deterministic=*/false);
}

// find: the call's inputs when the choice is measured (benchmark), null for the heuristics'.
Choice choose(const char* what, Pass pass, int device, cudnnHandle_t handle, const Conv2dShape& s,
              const Descriptors& d, const FindInputs* find) {
  if (find != nullptr) {
    // Find tries only the math the descriptor allows.
    DPE_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, is_16bit(s.dtype) ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
  }
  int count = 0;
  switch (pass) {
    case Pass::Forward:
      DPE_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &count));
      return rank<cudnnConvolutionFwdAlgoPerf_t>(
          what, device, s, find, count,
          [&](int n, int* got, cudnnConvolutionFwdAlgoPerf_t* p) {
            return cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x.d, d.w.d, d.conv.d, d.y.d, n, got, p);
          },
          [&](void* out, int n, int* got, cudnnConvolutionFwdAlgoPerf_t* p, void* ws, size_t ws_bytes) {
            return cudnnFindConvolutionForwardAlgorithmEx(handle, d.x.d, find->a, d.w.d, find->b, d.conv.d, d.y.d,
                                                          out, n, got, p, ws, ws_bytes);
          });
    case Pass::BackwardData:
      DPE_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &count));
      return rank<cudnnConvolutionBwdDataAlgoPerf_t>(
          what, device, s, find, count,
          [&](int n, int* got, cudnnConvolutionBwdDataAlgoPerf_t* p) {
            return cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, d.w.d, d.y.d, d.conv.d, d.x.d, n, got, p);
          },
          [&](void* out, int n, int* got, cudnnConvolutionBwdDataAlgoPerf_t* p, void* ws, size_t ws_bytes) {
            return cudnnFindConvolutionBackwardDataAlgorithmEx(handle, d.w.d, find->a, d.y.d, find->b, d.conv.d,
                                                               d.x.d, out, n, got, p, ws, ws_bytes);
          });
    case Pass::BackwardFilter:
      DPE_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &count));
      return rank<cudnnConvolutionBwdFilterAlgoPerf_t>(
          what, device, s, find, count,
          [&](int n, int* got, cudnnConvolutionBwdFilterAlgoPerf_t* p) {
            return cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, d.x.d, d.y.d, d.conv.d, d.w.d, n, got, p);
          },
          [&](void* out, int n, int* got, cudnnConvolutionBwdFilterAlgoPerf_t* p, void* ws, size_t ws_bytes) {
            return cudnnFindConvolutionBackwardFilterAlgorithmEx(handle, d.x.d, find->a, d.y.d, find->b, d.conv.d,
                                                                 d.w.d, out, n, got, p, ws, ws_bytes);
          });
  }
  DPE_INTERNAL_ASSERT(false, "unknown conv pass ", static_cast<int>(pass));
}

// Everything a call needs besides its data, for one (pass, benchmark, device, shape): the descriptors, the
// algorithm of Note [cuDNN algorithm choice] (its math set on d.conv) and that algorithm's workspace size.
// Built by the shape's first call and kept, as PyTorch keeps its cuDNN plans: a training loop repeats its
// shapes every step, and the workspace-size query alone costs 33 us of host time per call (cuDNN 9.14 on an
// H100 machine; the descriptors 1 us), more than a small convolution's kernel (docs/BENCHMARKS.md,
// cudnn_call_overhead_bench).
// Never changed once cached, so calls may share one; the key's device keeps devices apart (each has its own
// handle and stream).
struct Plan {
  Descriptors d;
  Choice choice;
  size_t workspace_bytes = 0;
  Plan(const char* what, const Conv2dShape& s) : d(what, s) {}
};

size_t workspace_size(Pass pass, cudnnHandle_t handle, const Descriptors& d, int algo) {
  size_t bytes = 0;
  switch (pass) {
    case Pass::Forward:
      DPE_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle, d.x.d, d.w.d, d.conv.d, d.y.d,
                                                              static_cast<cudnnConvolutionFwdAlgo_t>(algo), &bytes));
      break;
    case Pass::BackwardData:
      DPE_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
          handle, d.w.d, d.y.d, d.conv.d, d.x.d, static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), &bytes));
      break;
    case Pass::BackwardFilter:
      DPE_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
          handle, d.x.d, d.y.d, d.conv.d, d.w.d, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), &bytes));
      break;
  }
  return bytes;
}

// The cached Plan of this call's pass and shape, built on a miss (outside the lock: a benchmark Find runs
// kernels). Two threads missing the same key at once both build one and the first cached is kept.
const Plan& plan_for(const char* what, Pass pass, int device, cudnnHandle_t handle, const Conv2dShape& s,
                     const FindInputs& inputs) {
  static std::mutex mutex;
  static auto* cache = new std::map<Key, std::unique_ptr<const Plan>>;  // never destroyed (cuda_device.cc)
  const bool benchmark = backends::cudnn::benchmark();
  const Key key = key_of(pass, benchmark, device, s);
  {
    std::lock_guard lock(mutex);
    if (auto it = cache->find(key); it != cache->end()) return *it->second;
  }
  auto plan = std::make_unique<Plan>(what, s);
  plan->choice = choose(what, pass, device, handle, s, plan->d, benchmark ? &inputs : nullptr);
  DPE_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->d.conv.d, plan->choice.math));
  plan->workspace_bytes = workspace_size(pass, handle, plan->d, plan->choice.algo);
  std::lock_guard lock(mutex);
  return *cache->try_emplace(key, std::move(plan)).first->second;
}

// alpha = 1, beta = 0 (and 1 for the bias add) in the dtype cuDNN expects for the scaling factors:
// double for double data, float otherwise.
struct Scalars {
  float f0 = 0.0f, f1 = 1.0f;
  double d0 = 0.0, d1 = 1.0;
  const void* zero(DType t) const { return t == DType::Float64 ? static_cast<const void*>(&d0) : &f0; }
  const void* one(DType t) const { return t == DType::Float64 ? static_cast<const void*>(&d1) : &f1; }
};

cudnnHandle_t handle_on(int device, cudaStream_t stream) {
  cudnnHandle_t handle = cuda::cudnn_handle(device);
  DPE_CUDNN_CHECK(cudnnSetStream(handle, stream));
  return handle;
}

// Runs `pass(result)` so that its `numel` results end up in `out` (conv2d_output_dtype): directly for float32
// and float64 operands, through a 16-bit scratch block widened afterwards for 16-bit ones (Note [16-bit
// convolutions]).
template <typename Run>
void into_output(cudaStream_t stream, int device, DType operands, int64_t numel, void* out, Run pass) {
  if (!is_16bit(operands)) {
    pass(out);
    return;
  }
  Workspace scratch(device, static_cast<size_t>(numel) * element_size(operands));
  pass(scratch.get());
  const Layout layout = contiguous_layout(1, &numel);
  copy_cuda(stream, scratch.get(), operands, layout, out, conv2d_output_dtype(operands), layout);
}

}  // namespace

// x: (N, C_in, H, W)  w: (C_out, C_in/g, kH, kW)  b: (C_out) or null  y: (N, C_out, H_out, W_out)
void conv2d_forward_cuda(cudaStream_t stream, int device, const Conv2dShape& s, const void* x, const void* w,
                         const void* b, void* y) {
  const char* what = "conv2d_forward_cuda";
  check_conv2d_shape(what, s);
  DPE_CHECK(!s.f32_activations, what, ": float32 activations with 16-bit operands are CPU-only (cast them)");
  DPE_CHECK(!s.channels_last, what, ": channels-last activations are CPU-only (the op hands cuDNN NCHW)");
  if (s.n == 0) return;
  cudnnHandle_t handle = handle_on(device, stream);
  const Plan& plan =
      plan_for(what, Pass::Forward, device, handle, s, {x, w, s.n * s.c_out * s.h_out() * s.w_out()});
  const Descriptors& d = plan.d;
  const auto algo = static_cast<cudnnConvolutionFwdAlgo_t>(plan.choice.algo);
  Workspace ws(device, plan.workspace_bytes);
  const Scalars k;
  into_output(stream, device, s.dtype, s.n * s.c_out * s.h_out() * s.w_out(), y, [&](void* result) {
    DPE_CUDNN_CHECK(cudnnConvolutionForward(handle, k.one(s.dtype), d.x.d, x, d.w.d, w, d.conv.d, algo, ws.get(),
                                            ws.size(), k.zero(s.dtype), d.y.d, result));
  });
  if (b != nullptr) {
    DPE_CUDNN_CHECK(cudnnAddTensor(handle, k.one(s.dtype), d.bias.d, b, k.one(s.dtype), d.y_out.d, y));
  }
}

// dy: (N, C_out, H_out, W_out)  w: (C_out, C_in/g, kH, kW)  dx: (N, C_in, H, W)
void conv2d_backward_data_cuda(cudaStream_t stream, int device, const Conv2dShape& s, const void* dy, const void* w,
                               void* dx) {
  const char* what = "conv2d_backward_data_cuda";
  check_conv2d_shape(what, s);
  DPE_CHECK(!s.f32_activations, what, ": float32 activations with 16-bit operands are CPU-only (cast them)");
  DPE_CHECK(!s.channels_last, what, ": channels-last activations are CPU-only (the op hands cuDNN NCHW)");
  if (s.n == 0) return;
  cudnnHandle_t handle = handle_on(device, stream);
  const Plan& plan = plan_for(what, Pass::BackwardData, device, handle, s, {w, dy, s.n * s.c_in * s.h * s.w});
  const Descriptors& d = plan.d;
  const auto algo = static_cast<cudnnConvolutionBwdDataAlgo_t>(plan.choice.algo);
  Workspace ws(device, plan.workspace_bytes);
  const Scalars k;
  into_output(stream, device, s.dtype, s.n * s.c_in * s.h * s.w, dx, [&](void* result) {
    DPE_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, k.one(s.dtype), d.w.d, w, d.y.d, dy, d.conv.d, algo,
                                                 ws.get(), ws.size(), k.zero(s.dtype), d.x.d, result));
  });
}

// x: (N, C_in, H, W)  dy: (N, C_out, H_out, W_out)  dw: (C_out, C_in/g, kH, kW)
void conv2d_backward_weight_cuda(cudaStream_t stream, int device, const Conv2dShape& s, const void* x,
                                 const void* dy, void* dw) {
  const char* what = "conv2d_backward_weight_cuda";
  check_conv2d_shape(what, s);
  DPE_CHECK(!s.f32_activations, what, ": float32 activations with 16-bit operands are CPU-only (cast them)");
  DPE_CHECK(!s.channels_last, what, ": channels-last activations are CPU-only (the op hands cuDNN NCHW)");
  const int64_t count = s.c_out * (s.c_in / s.groups) * s.kh * s.kw;
  if (s.n == 0) {
    DPE_CUDA_CHECK(
        cudaMemsetAsync(dw, 0, static_cast<size_t>(count) * element_size(conv2d_output_dtype(s.dtype)), stream));
    return;
  }
  cudnnHandle_t handle = handle_on(device, stream);
  const Plan& plan = plan_for(what, Pass::BackwardFilter, device, handle, s, {x, dy, count});
  const Descriptors& d = plan.d;
  const auto algo = static_cast<cudnnConvolutionBwdFilterAlgo_t>(plan.choice.algo);
  Workspace ws(device, plan.workspace_bytes);
  const Scalars k;
  into_output(stream, device, s.dtype, count, dw, [&](void* result) {
    DPE_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, k.one(s.dtype), d.x.d, x, d.y.d, dy, d.conv.d, algo,
                                                   ws.get(), ws.size(), k.zero(s.dtype), d.w.d, result));
  });
}

}  // namespace dpe::kernels
