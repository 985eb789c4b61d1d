#include "collectives/reduce_buffers.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

template <typename T>
void weighted_sum(const std::vector<const void*>& inputs, const std::vector<double>& scales,
                  const std::vector<void*>& outputs, int64_t count) {
  // fma(s, x, 0): each product rounded once, as affine_cpu's scaled copy rounds it.
  if (inputs.size() == 2 && outputs.size() == 2) {
    // Two members (the common DDP case): one streaming pass. ivdep: iteration i reads and writes only element
    // i, so outputs that alias inputs (in place) vectorize too.
    const T* a = static_cast<const T*>(inputs[0]);
    const T* b = static_cast<const T*>(inputs[1]);
    T* x = static_cast<T*>(outputs[0]);
    T* y = static_cast<T*>(outputs[1]);
    const T sa = static_cast<T>(scales[0]), sb = static_cast<T>(scales[1]);
#pragma GCC ivdep
    for (int64_t i = 0; i < count; ++i) {
      const T v = std::fma(sa, a[i], T(0)) + std::fma(sb, b[i], T(0));
      x[i] = v;
      y[i] = v;
    }
    return;
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
                              const std::vector<void*>& outputs, int64_t count) {
  DPE_INTERNAL_ASSERT(!inputs.empty() && inputs.size() == scales.size() && count >= 0);
  switch (dtype) {
    case DType::Float32: return weighted_sum<float>(inputs, scales, outputs, count);
    case DType::Float64: return weighted_sum<double>(inputs, scales, outputs, count);
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
