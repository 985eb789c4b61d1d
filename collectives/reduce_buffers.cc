#include "collectives/reduce_buffers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "core/error.h"

namespace dpe {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

namespace {

// Blocks small enough that the accumulator stays in L1 while every input streams through once.
constexpr int64_t kBlock = 2048;

template <typename Storage, typename Acc, typename Load, typename Store>
void reduce_typed(ReduceOp op, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                  int64_t count, Load load, Store store) {
  Acc acc[kBlock];
  const size_t n = inputs.size();
  for (int64_t start = 0; start < count; start += kBlock) {
    const int64_t len = std::min(kBlock, count - start);
    const Storage* first = static_cast<const Storage*>(inputs[0]) + start;
    for (int64_t i = 0; i < len; ++i) acc[i] = load(first[i]);
    for (size_t k = 1; k < n; ++k) {
      const Storage* in = static_cast<const Storage*>(inputs[k]) + start;
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg:
          for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<Acc>(acc[i] + load(in[i]));
          break;
        case ReduceOp::Max:
          for (int64_t i = 0; i < len; ++i) acc[i] = std::max(acc[i], load(in[i]));
          break;
        case ReduceOp::Min:
          for (int64_t i = 0; i < len; ++i) acc[i] = std::min(acc[i], load(in[i]));
          break;
      }
    }
    if (op == ReduceOp::Avg) {
      const Acc divisor = static_cast<Acc>(n);
      for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<Acc>(acc[i] / divisor);
    }
    for (void* out : outputs) {
      Storage* dst = static_cast<Storage*>(out) + start;
      for (int64_t i = 0; i < len; ++i) dst[i] = store(acc[i]);
    }
  }
}

template <typename T>
void reduce_plain(ReduceOp op, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                  int64_t count) {
  auto identity = [](T v) { return v; };
  reduce_typed<T, T>(op, inputs, outputs, count, identity, identity);
}

// Note [Streaming the partner's sums]
// DDP's all-reduce on CPU devices in one process (all_reduce_into) has each member sum its share of the bucket and
// write the sums into every member's bucket. The partner's copy is read next by the partner's optimizer, on the
// partner's core. A plain store first fetches its line for ownership, out of the partner's cache where its last
// optimizer step left it, and the partner's read then fetches the line back: it crosses between the cores twice. A
// non-temporal store writes whole lines past the caches without fetching them, and the partner reads them from memory,
// which its prefetchers stream. On the MLP's DDP step (2 CPU devices, 2.7 MB of gradients) the step got 0.06-0.11 ms
// shorter in four alternating pairs, the all-reduce taking 0.18-0.26 against 0.18-0.38 ms (docs/BENCHMARKS.md,
// "What each CPU kernel gained in the step"). The member's own sums stay plain stores: its optimizer reads them next, from this core's cache.
// The sfence at the end orders the streamed stores before whatever the member stores next, so the rendezvous that tells
// the partner the sums are there publishes them too. Only the two-member float32 pass streams (the measured case: these
// VMs have two cores); more members write every output plainly.

// Two members: local[i] = remote[i] = sa x a[i] + sb x b[i], one pass.
template <typename T>
void weighted_sum_pair(const T* a, const T* b, T sa, T sb, T* local, T* remote, int64_t count) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<T, float>) {
    // Scalar up to remote's first 32-byte boundary (what _mm256_stream_ps needs), then 8 lanes at a time: the
    // same roundings as the scalar loop, so the bits do not depend on where a piece starts.
    for (; i < count && reinterpret_cast<uintptr_t>(remote + i) % 32 != 0; ++i) {
      const float v = std::fma(sa, a[i], 0.0f) + std::fma(sb, b[i], 0.0f);
      local[i] = v;
      remote[i] = v;
    }
    const __m256 va = _mm256_set1_ps(sa), vb = _mm256_set1_ps(sb), zero = _mm256_setzero_ps();
    for (; i + 8 <= count; i += 8) {
      const __m256 v = _mm256_add_ps(_mm256_fmadd_ps(va, _mm256_loadu_ps(a + i), zero),
                                     _mm256_fmadd_ps(vb, _mm256_loadu_ps(b + i), zero));
      _mm256_storeu_ps(local + i, v);
      _mm256_stream_ps(remote + i, v);
    }
    _mm_sfence();
  }
#endif
  // ivdep: iteration i reads and writes only element i, so outputs that alias inputs (in place) vectorize too.
#pragma GCC ivdep
  for (; i < count; ++i) {
    const T v = std::fma(sa, a[i], T(0)) + std::fma(sb, b[i], T(0));
    local[i] = v;
    remote[i] = v;
  }
}

template <typename T>
void weighted_sum(const std::vector<const void*>& inputs, const std::vector<double>& scales,
                  const std::vector<void*>& outputs, size_t local, int64_t count) {
  // fma(s, x, 0): each product rounded once, as affine_cpu's scaled copy rounds it.
  if (inputs.size() == 2 && outputs.size() == 2) {  // the common DDP case
    return weighted_sum_pair(static_cast<const T*>(inputs[0]), static_cast<const T*>(inputs[1]),
                             static_cast<T>(scales[0]), static_cast<T>(scales[1]), static_cast<T*>(outputs[local]),
                             static_cast<T*>(outputs[1 - local]), count);
  }
  T acc[kBlock];
  for (int64_t start = 0; start < count; start += kBlock) {
    const int64_t len = std::min(kBlock, count - start);
    for (size_t k = 0; k < inputs.size(); ++k) {
      const T* in = static_cast<const T*>(inputs[k]) + start;
      const T s = static_cast<T>(scales[k]);
      if (k == 0) {
        for (int64_t i = 0; i < len; ++i) acc[i] = std::fma(s, in[i], T(0));
      } else {
        for (int64_t i = 0; i < len; ++i) acc[i] += std::fma(s, in[i], T(0));
      }
    }
    for (void* out : outputs) {
      T* dst = static_cast<T*>(out) + start;
      for (int64_t i = 0; i < len; ++i) dst[i] = acc[i];
    }
  }
}

}  // namespace

void weighted_sum_buffers_cpu(DType dtype, const std::vector<const void*>& inputs, const std::vector<double>& scales,
                              const std::vector<void*>& outputs, size_t local, int64_t count) {
  DPE_INTERNAL_ASSERT(!inputs.empty() && inputs.size() == scales.size() && local < outputs.size() && count >= 0);
  switch (dtype) {
    case DType::Float32: return weighted_sum<float>(inputs, scales, outputs, local, count);
    case DType::Float64: return weighted_sum<double>(inputs, scales, outputs, local, count);
    default: DPE_INTERNAL_ASSERT(false, "weighted_sum_buffers_cpu: no kernel for ", dtype);
  }
}

void reduce_buffers_cpu(DType dtype, ReduceOp op, const std::vector<const void*>& inputs,
                        const std::vector<void*>& outputs, int64_t count) {
  DPE_INTERNAL_ASSERT(!inputs.empty() && count >= 0);
  switch (dtype) {
    case DType::Float32: return reduce_plain<float>(op, inputs, outputs, count);
    case DType::Float64: return reduce_plain<double>(op, inputs, outputs, count);
    case DType::Int64: return reduce_plain<int64_t>(op, inputs, outputs, count);
    case DType::Int32: return reduce_plain<int32_t>(op, inputs, outputs, count);
    case DType::UInt8: return reduce_plain<uint8_t>(op, inputs, outputs, count);
    case DType::Float16:
      return reduce_typed<Half, float>(op, inputs, outputs, count, [](Half h) { return half_to_float(h); },
                                       [](float f) { return float_to_half(f); });
    case DType::BFloat16:
      return reduce_typed<BFloat16, float>(op, inputs, outputs, count,
                                           [](BFloat16 h) { return bfloat16_to_float(h); },
                                           [](float f) { return float_to_bfloat16(f); });
  }
  DPE_INTERNAL_ASSERT(false, "unknown dtype");
}

}  // namespace dpe
