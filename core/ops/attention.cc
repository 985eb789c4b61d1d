// scaled_dot_product_attention (core/ops/attention.h): kernels/attention.h for causal float32 self-attention on
// CPU devices, composed from tensor ops elsewhere.
#include "core/ops/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/amp/autocast.h"
#include "core/autograd/function.h"
#include "core/dispatch.h"
#include "core/kernels/attention.h"
#include "core/ops.h"
#include "core/ops/op_checks.h"

namespace dpe {

using detail::empty_strided_if_dense;
using detail::options_of;

namespace {

// The dims before the last two.
Shape leading(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

// t (..., rows, cols) with unit column stride (a copy where it has none), and the element offsets of its
// matrices from its data pointer, in index order of the leading dims.
struct Matrices {
  Tensor t;
  std::vector<int64_t> offsets;

  explicit Matrices(const Tensor& x) : t(x.strides().back() == 1 ? x : x.contiguous()) {
    const int64_t lead = t.dim() - 2;
    int64_t count = 1;
    for (int64_t d = 0; d < lead; ++d) count *= t.size(d);
    offsets.resize(static_cast<size_t>(count));
    std::vector<int64_t> index(static_cast<size_t>(lead), 0);
    int64_t offset = 0;
    for (int64_t m = 0; m < count; ++m) {
      offsets[static_cast<size_t>(m)] = offset;
      for (int64_t d = lead - 1; d >= 0; --d) {  // the next index, row-major, and its offset
        offset += t.strides()[static_cast<size_t>(d)];
        if (++index[static_cast<size_t>(d)] < t.size(d)) break;
        offset -= t.strides()[static_cast<size_t>(d)] * t.size(d);
        index[static_cast<size_t>(d)] = 0;
      }
    }
  }
  kernels::MatrixBatch batch() const {
    return {static_cast<float*>(t.data_ptr()), offsets.data(), t.strides()[t.strides().size() - 2]};
  }
};

// A fresh tensor shaped and laid out like `like` (see empty_strided_if_dense).
Tensor empty_like_layout(const Tensor& like) { return empty_strided_if_dense(like.shape(), like.strides(), options_of(like)); }

Tensor fused_causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const Matrices qm(q.detach()), km(k.detach()), vm(v.detach());
  const int64_t count = static_cast<int64_t>(qm.offsets.size()), T = q.size(-2), d = q.size(-1);
  const kernels::AttentionShape shape{.count = count, .T = T, .d = d, .scale = scale};
  Tensor probs = Tensor::empty({count, T, T}, options_of(q));
  Tensor out = empty_like_layout(vm.t);
  const Matrices om(out);
  dispatch_cpu_only(q.device(), [&] {
    kernels::causal_attention_forward_cpu(shape, qm.batch(), km.batch(), vm.batch(), static_cast<float*>(probs.data_ptr()),
                                          om.batch());
  });
  autograd::record(out, {q, k, v}, "ScaledDotProductAttentionBackward",
                   [shape, qm, km, vm, probs](const Tensor& g) {
                     const Matrices gm(g);
                     Tensor dq = empty_like_layout(qm.t), dk = empty_like_layout(km.t), dv = empty_like_layout(vm.t);
                     const Matrices dqm(dq), dkm(dk), dvm(dv);
                     dispatch_cpu_only(g.device(), [&] {
                       kernels::causal_attention_backward_cpu(shape, qm.batch(), km.batch(), vm.batch(),
                                                              static_cast<const float*>(probs.data_ptr()), gm.batch(),
                                                              dqm.batch(), dkm.batch(), dvm.batch());
                     });
                     return std::vector<Tensor>{dq, dk, dv};
                   });
  return out;
}

Shape with_last_two(Shape lead, int64_t a, int64_t b) {
  lead.push_back(a);
  lead.push_back(b);
  return lead;
}

}  // namespace

Tensor causal_attention_mask(int64_t L, int64_t S, TensorOptions options) {
  std::vector<double> mask(static_cast<size_t>(L * S), 0.0);
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t j = i + 1; j < S; ++j) mask[static_cast<size_t>(i * S + j)] = -std::numeric_limits<double>::infinity();
  }
  return Tensor::from_vector(mask, {L, S}, options);
}

bool fused_causal_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v) {
  return q.device().is_cpu() && q.dtype() == DType::Float32 && q.dim() >= 2 && q.shape() == k.shape() &&
         q.shape() == v.shape() && k.device() == q.device() && v.device() == q.device() &&
         k.dtype() == DType::Float32 && v.dtype() == DType::Float32 && q.numel() > 0 &&
         !amp::lower_precision_dtype(q.device());
}

// q: (..., L, E)  k: (..., S, E)  v: (..., S, Ev)  ->  (..., L, Ev)
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    bool is_causal, std::optional<double> scale) {
  constexpr const char* op = "scaled_dot_product_attention";
  detail::check_compute_dtype(q, op);
  detail::check_same_device_and_dtype(q, k, "scaled_dot_product_attention (query and key)");
  detail::check_same_device_and_dtype(q, v, "scaled_dot_product_attention (query and value)");
  DPE_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim() && leading(k) == leading(q) &&
                leading(v) == leading(q) && k.size(-1) == q.size(-1) && v.size(-2) == k.size(-2),
            op, ": expected query (..., L, E), key (..., S, E) and value (..., S, Ev) with the same leading dims, got ",
            shape_str(q.shape()), ", ", shape_str(k.shape()), " and ", shape_str(v.shape()));
  DPE_CHECK(!(is_causal && attn_mask.defined()), op, ": attn_mask and is_causal together; pass one of them");
  DPE_CHECK(!scale || std::isfinite(*scale), op, ": scale must be finite, got ", scale.value_or(0.0));
  const int64_t L = q.size(-2), S = k.size(-2), E = q.size(-1), Ev = v.size(-1);
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(E)));
  if (is_causal && fused_causal_attention_applies(q, k, v)) return fused_causal_attention(q, k, v, s);

  // The composition, op for op as attention was written before the fused kernels (layers/attention.cc).
  const Shape lead = leading(q);
  int64_t n = 1;  // matrices
  for (int64_t size : lead) n *= size;
  Tensor scores = bmm(q.reshape({n, L, E}), k.reshape({n, S, E}).transpose(1, 2)) * s;
  scores = scores.view(with_last_two(lead, L, S));
  if (attn_mask.defined()) {
    detail::check_same_device_and_dtype(q, attn_mask, "scaled_dot_product_attention (query and attn_mask)");
    scores = scores + attn_mask;
  } else if (is_causal) {
    scores = scores + causal_attention_mask(L, S, options_of(q));
  }
  Tensor probs = softmax(scores, -1);
  return bmm(probs.reshape({n, L, S}), v.reshape({n, S, Ev})).view(with_last_two(lead, L, Ev));
}

}  // namespace dpe
