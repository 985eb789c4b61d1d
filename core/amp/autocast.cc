#include "core/amp/autocast.h"

#include <atomic>
#include <cstdio>
#include <map>
#include <utility>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/kernels/matmul.h"

namespace dpe::amp {
namespace {

thread_local AutocastState state;

// Keyed by the source tensor and the target dtype; the entry holds the source, so its address cannot be
// reused by another tensor while cached.
struct CachedCast {
  Tensor source, cast;
};
thread_local std::map<std::pair<const void*, DType>, CachedCast> cast_cache;

// Decides what a CPU guard asking for bfloat16 gets: bfloat16, or (no bf16 instructions) nullopt and a
// one-time warning.
std::optional<DType> cpu_dtype_granted(DType requested) {
  if (cpu_supports_bf16()) return requested;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    std::fprintf(stderr,
                 "dpe: warning: this CPU has no bfloat16 instructions (avx512_core_bf16), so CPU autocast computes "
                 "in float32: oneDNN's bfloat16 emulation is slower than float32\n");
  }
  return std::nullopt;
}

}  // namespace

AutocastState autocast_state() { return state; }

void set_autocast_state(const AutocastState& s) {
  if (s.depth == 0 || state.depth == 0) clear_autocast_cache();
  state = s;
}

DType default_autocast_dtype(DeviceKind kind) { return kind == DeviceKind::CPU ? DType::BFloat16 : DType::Float16; }

bool cpu_supports_bf16() { return kernels::cpu_has_bf16_instructions(); }

AutocastGuard::AutocastGuard(DeviceKind kind, std::optional<DType> dtype, bool enabled) : previous_(state) {
  const DType requested = dtype.value_or(default_autocast_dtype(kind));
  const char* kind_name = kind == DeviceKind::CPU ? "cpu" : "cuda";
  DPE_CHECK(requested == DType::BFloat16 || requested == DType::Float16, "autocast(", kind_name, "): dtype ",
            requested, " is not a lower-precision type; expected bfloat16 or float16");
  DPE_CHECK(kind != DeviceKind::CPU || requested == DType::BFloat16, "autocast(cpu): dtype ", requested,
            " is not supported on CPU (oneDNN has no float16 CPU products); use bfloat16, or float16 on CUDA");
  std::optional<DType> granted;
  if (enabled) granted = kind == DeviceKind::CPU ? cpu_dtype_granted(requested) : std::optional<DType>(requested);
  (kind == DeviceKind::CPU ? state.cpu : state.cuda) = granted;
  ++state.depth;
}

AutocastGuard::~AutocastGuard() {
  state = previous_;
  if (state.depth == 0) clear_autocast_cache();
}

std::optional<DType> lower_precision_dtype(const Device& device) {
  return device.is_cpu() ? state.cpu : state.cuda;
}

Tensor cast_operand(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t.detach();
  if (t.dim() >= 2 && !t.is_contiguous()) {
    // A transposed view (a weight's .t(), a gradient's transpose in backward) is cast in its storage order and
    // viewed again: the GEMMs take transposed operands as they are, and a transposing copy is several times
    // slower than a straight one.
    Tensor stored = t.transpose(-2, -1);
    if (stored.is_contiguous()) return cast_operand(stored, dtype).transpose(-2, -1);
  }
  const bool cacheable = state.depth > 0 && t.is_leaf() && t.requires_grad();
  if (!cacheable) {
    NoGradGuard no_grad;
    return t.detach().to(dtype);
  }
  auto key = std::make_pair(static_cast<const void*>(t.impl()), dtype);
  auto it = cast_cache.find(key);
  if (it == cast_cache.end()) {
    NoGradGuard no_grad;
    it = cast_cache.emplace(key, CachedCast{t, t.detach().to(dtype)}).first;
  }
  return it->second.cast;
}

void clear_autocast_cache() { cast_cache.clear(); }

}  // namespace dpe::amp
