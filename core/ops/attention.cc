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
using detail::with_unit_last_stride;

namespace {

// The dims before the last two.
Shape leading(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

// t (..., rows, cols) with unit column stride (a copy where it has none), and the element offsets of its
// matrices from its data pointer, in index order of the leading dims.
struct Matrices {
  Tensor t;
  std::vector<int64_t> offsets;

  explicit Matrices(const Tensor& x) : t(with_unit_last_stride(x)) {
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

Tensor fused_causal_attention_cpu(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
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

// A (B, heads, T, d) tensor with unit feature stride as the CUDA kernels' view of it.
kernels::AttentionHeads heads_of(const Tensor& t) {
  return {static_cast<float*>(t.data_ptr()), t.strides()[0], t.strides()[1], t.strides()[2]};
}

// q (B, H, T, d), k and v (B, Hkv, T, d), key_keep (B, T) contiguous or undefined: fused_causal_attention_applies
// holds. The output is (B, T, H, d) memory seen as (B, H, T, d), so that attention's permute back to
// (B, T, H * d) is a view; the backward keeps the inputs, the output and the log-sum-exps (B, H, T).
Tensor fused_causal_attention_cuda(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& key_keep,
                                   double scale) {
  const Tensor q = with_unit_last_stride(q_in.detach()), k = with_unit_last_stride(k_in.detach()),
               v = with_unit_last_stride(v_in.detach());
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), d = q.size(3);
  const kernels::AttentionCudaShape shape{
      .B = B,
      .H = H,
      .Hkv = k.size(1),
      .T = T,
      .d = d,
      .scale = scale,
      .operand = amp::lower_precision_dtype(q.device()).value_or(DType::Float32),
      .key_keep = key_keep.defined() ? static_cast<const float*>(key_keep.data_ptr()) : nullptr};
  Tensor out = Tensor::empty({B, T, H, d}, options_of(q)).permute({0, 2, 1, 3});
  const Tensor lse = Tensor::empty({B, H, T}, options_of(q));
  dispatch_cuda_only(q.device(), [&](auto stream) {
    kernels::causal_attention_forward_cuda(stream, shape, heads_of(q), heads_of(k), heads_of(v), heads_of(out),
                                           static_cast<float*>(lse.data_ptr()));
  });
  // The node keeps out detached: out itself would hold the node that holds it.
  autograd::record(out, {q_in, k_in, v_in}, "ScaledDotProductAttentionBackward",
                   [shape, q, k, v, key_keep, saved = out.detach(), lse](const Tensor& g) {
                     const Tensor dout = with_unit_last_stride(g);
                     Tensor dq = empty_like_layout(q), dk = empty_like_layout(k), dv = empty_like_layout(v);
                     Tensor dots = Tensor::empty({shape.B * shape.H * shape.T}, options_of(q));
                     dispatch_cuda_only(g.device(), [&](auto stream) {
                       kernels::causal_attention_backward_cuda(
                           stream, shape, heads_of(q), heads_of(k), heads_of(v), heads_of(saved),
                           static_cast<const float*>(lse.data_ptr()), heads_of(dout), heads_of(dq), heads_of(dk),
                           heads_of(dv), static_cast<float*>(dots.data_ptr()));
                     });
                     return std::vector<Tensor>{dq, dk, dv};
                   });
  return out;
}

// Whether the CUDA kernels take these operands (fused_causal_attention_applies on a CUDA device).
bool cuda_kernels_apply(const Tensor& q, const Tensor& k, const Tensor& v) {
  const auto is_f32_on_q_device = [&](const Tensor& t) {
    return t.dtype() == DType::Float32 && t.device() == q.device() && t.dim() == 4;
  };
  if (!is_f32_on_q_device(q) || !is_f32_on_q_device(k) || !is_f32_on_q_device(v) || q.numel() == 0) return false;
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), d = q.size(3), Hkv = k.size(1);
  if (k.shape() != (Shape{B, Hkv, T, d}) || v.shape() != k.shape() || H % Hkv != 0 || B * H > 65535 ||
      d > kernels::kAttentionCudaMaxD) {
    return false;
  }
  const DType operand = amp::lower_precision_dtype(q.device()).value_or(DType::Float32);
  bool fits = false;
  dispatch_cuda_only(q.device(), [&](auto) { fits = kernels::causal_attention_cuda_fits(operand, d); });
  return fits;
}

// The fused kernels of q's device, fused_causal_attention_applies(q, k, v, key_keep.defined()) having held.
Tensor fused_kernels(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep, double scale) {
  return q.device().is_cpu() ? fused_causal_attention_cpu(q, k, v, scale)
                             : fused_causal_attention_cuda(q, k, v, key_keep, scale);
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

bool fused_causal_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v, bool key_padding) {
  if (q.device().is_cuda()) return cuda_kernels_apply(q, k, v);
  return !key_padding && q.device().is_cpu() && q.dtype() == DType::Float32 && q.dim() >= 2 &&
         q.shape() == k.shape() && q.shape() == v.shape() && k.device() == q.device() && v.device() == q.device() &&
         k.dtype() == DType::Float32 && v.dtype() == DType::Float32 && q.numel() > 0 &&
         !amp::lower_precision_dtype(q.device());
}

Tensor fused_causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                              std::optional<double> scale) {
  constexpr const char* op = "fused_causal_attention";
  DPE_CHECK(q.defined() && k.defined() && v.defined(), op, ": query, key and value must be defined");
  DPE_CHECK(fused_causal_attention_applies(q, k, v, key_keep.defined()), op, ": no fused kernel for query ",
            shape_str(q.shape()), " ", q.dtype(), " on ", q.device(), ", key ", shape_str(k.shape()), " ", k.dtype(),
            " on ", k.device(), ", value ", shape_str(v.shape()), " ", v.dtype(), " on ", v.device(),
            key_keep.defined() ? " with a key padding mask" : "",
            " (CPU devices: float32, key and value shaped as the query, no padding mask, no autocast; CUDA devices: "
            "float32 (B, H, T, d) query, (B, Hkv, T, d) key and value with H % Hkv == 0, d <= ",
            kernels::kAttentionCudaMaxD, "); fused_causal_attention_applies says which");
  DPE_CHECK(!scale || std::isfinite(*scale), op, ": scale must be finite, got ", scale.value_or(0.0));
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  Tensor keep;
  if (key_keep.defined()) {
    DPE_CHECK(key_keep.shape() == (Shape{q.size(0), q.size(2)}) && key_keep.dtype() == DType::Float32 &&
                  key_keep.device() == q.device(),
              op, ": key_keep must be float32 (B, T) = [", q.size(0), ", ", q.size(2), "] on ", q.device(), ", got ",
              shape_str(key_keep.shape()), " ", key_keep.dtype(), " on ", key_keep.device());
    keep = key_keep.detach().contiguous();
  }
  return fused_kernels(q, k, v, keep, s);
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
  if (is_causal && fused_causal_attention_applies(q, k, v)) return fused_kernels(q, k, v, {}, s);

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
