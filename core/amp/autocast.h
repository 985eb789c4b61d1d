// Autocast: PyTorch's torch.autocast for dpe. Inside a guard, matrix products (matmul, bmm, Linear, the
// attention products) and convolutions take float32 operands in a lower precision, bfloat16 or float16, and
// accumulate in float32; everything else (losses, softmax, normalisation, reductions, elementwise ops) runs
// in float32, as PyTorch's op policy has it (docs/MIXED_PRECISION.md lists the ops).
//
//   {
//     amp::AutocastGuard autocast(DeviceKind::CPU, DType::BFloat16);
//     Tensor loss = cross_entropy(model.forward(x), y);   // Linear/Conv2d products in bfloat16
//   }
//   loss.backward();   // the products' backward GEMMs/convolutions use the same bfloat16 operands
//
// Where dpe differs from PyTorch, on purpose:
//  - Outputs stay float32 (PyTorch returns bfloat16 tensors): dpe's elementwise kernels compute in float32,
//    the product itself is exact float32 accumulation of the 16-bit operands, and nothing is rounded twice.
//    The speed comes from the products (2x on CPUs with avx512_core_bf16); memory for activations is not
//    halved.
//  - A CPU convolution's bias gradient is the float32 sum of the bfloat16 dy its products read (PyTorch's
//    bfloat16 convolution sums that dy too, then rounds the sum to bfloat16); a Linear's stays the float32 sum
//    of the float32 gradient.
//  - The backward of a product made under autocast runs in the same lower precision whether or not autocast
//    is on when backward() runs (the 16-bit operands are what the node saved), so `loss.backward()` outside
//    the guard, as PyTorch users write it, is as fast as inside. Gradients reaching float32 tensors (the
//    master weights) are float32.
//
// Devices: CPU autocast is bfloat16 only (float16 is an error naming the dtype: oneDNN 2.6 has no CPU f16
// products). Where the CPU lacks bfloat16 instructions (kernels::cpu_has_bf16_instructions(); DPE_MAX_CPU_ISA
// below avx512_bf16 hides them: Note [The CPU instruction-set cap], core/cpu_isa.h), a CPU guard
// warns once on stderr and leaves autocast off: oneDNN's emulation is slower than float32 (measured,
// docs/MIXED_PRECISION.md). CUDA autocast takes bfloat16 or float16 (the default, like PyTorch) for GEMMs
// (cuBLAS) and convolutions (cuDNN, whose 16-bit results are rounded once before they are widened to float32:
// core/kernels/conv_cuda.cu).
//
// Thread-safety and threads: the state is per thread, like grad mode. dpe's DataParallel hands the calling
// thread's state to its device workers for each task (engine/worker_pool.h), so a caller's guard covers
// the replicas in DP and DDP mode, which PyTorch's DataParallel must re-enter autocast for.
//
// Cast cache (PyTorch's): the 16-bit copy of a float32 leaf that requires grad (a parameter) is made once per
// thread and kept until the outermost guard on that thread exits or clear_autocast_cache() runs, so a weight
// used several times in one forward is cast once. Like PyTorch: do not update parameters in place (an
// optimizer step) inside a guard and then use them again under it. DataParallel's train_step clears the cache
// after its optimizer step, and each device task starts and ends with an empty cache.
#pragma once

#include <optional>

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace dpe::amp {

// This thread's autocast settings. A dtype of nullopt: autocast is off for that device kind.
struct AutocastState {
  std::optional<DType> cpu;
  std::optional<DType> cuda;
  int depth = 0;  // guards active on this thread (the cast cache lives while depth > 0)
};

AutocastState autocast_state();
// For engines that run work on other threads (DataParallel's workers): installs `state` on this thread.
void set_autocast_state(const AutocastState& state);

// PyTorch's defaults: bfloat16 on CPU, float16 on CUDA.
DType default_autocast_dtype(DeviceKind kind);

// Turns autocast on (enabled) or off (!enabled, PyTorch's autocast(enabled=False) inside an autocast region)
// for `kind` until the guard is destroyed, restoring what was before. dtype: bfloat16 or float16 (CPU:
// bfloat16 only), default default_autocast_dtype(kind); anything else throws naming it.
class AutocastGuard {
 public:
  explicit AutocastGuard(DeviceKind kind, std::optional<DType> dtype = std::nullopt, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState previous_;
};

// The dtype the products on `device` cast float32 operands to on this thread, or nullopt.
std::optional<DType> lower_precision_dtype(const Device& device);

// Whether CPU autocast will compute in bfloat16 here (the CPU has bfloat16 instructions).
bool cpu_supports_bf16();

// `t` as `dtype`, detached (the op that calls it records its own backward). Parameters (float32 leaves that
// require grad) come from this thread's cast cache while a guard is active.
Tensor cast_operand(const Tensor& t, DType dtype);

// Empties this thread's cast cache.
void clear_autocast_cache();

}  // namespace dpe::amp
