// index_select and embedding on the row kernels of core/kernels/index.h, with scatter-add backward.
#include "core/ops/index.h"

#include "core/autograd/function.h"
#include "core/dispatch.h"
#include "core/kernels/index.h"
#include "core/ops.h"
#include "core/ops/op_checks.h"

namespace dpe {

using detail::check_compute_dtype;
using detail::options_of;

namespace {

void check_indices_tensor(const Tensor& table, const Tensor& indices, const char* op) {
  detail::check_defined(indices, op);
  DPE_CHECK(indices.dtype() == DType::Int64, op, ": indices must be int64, got ", indices.dtype());
  DPE_CHECK(indices.device() == table.device(), op, ": indices are on ", indices.device(), " but the table is on ",
            table.device(), "; move one with to()");
}

// table: (V, D) contiguous  flat: (n) int64 contiguous  ->  (n, D); no autograd.
Tensor gather_rows(const Tensor& table, const Tensor& flat) {
  const int64_t V = table.size(0), D = table.size(1), n = flat.numel();
  Tensor out = Tensor::empty({n, D}, options_of(table));
  const int64_t* idx = flat.data<int64_t>();
  dispatch(
      table.device(), [&] { kernels::index_select_cpu(table.dtype(), V, D, table.data_ptr(), n, idx, out.data_ptr()); },
      [&](auto stream) {
        kernels::index_select_cuda(stream, table.dtype(), V, D, table.data_ptr(), n, idx, out.data_ptr());
      });
  return out;
}

// g: (n, D)  flat: (n) int64 contiguous  ->  (V, D) zeros with g's rows added at flat; no autograd.
Tensor scatter_add_rows(const Tensor& g, const Tensor& flat, int64_t V) {
  Tensor src = g.contiguous();
  const int64_t D = src.size(1), n = flat.numel();
  Tensor out = zeros({V, D}, options_of(src));
  const int64_t* idx = flat.data<int64_t>();
  dispatch(
      src.device(), [&] { kernels::index_add_cpu(src.dtype(), V, D, n, idx, src.data_ptr(), out.data_ptr()); },
      [&](auto stream) {
        kernels::index_add_cuda(stream, src.dtype(), V, D, n, idx, src.data_ptr(), out.data_ptr());
      });
  return out;
}

}  // namespace

// x: (..., V at dim, ...)  indices: (n)  ->  (..., n at dim, ...)
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& indices) {
  check_compute_dtype(x, "index_select");
  check_indices_tensor(x, indices, "index_select");
  DPE_CHECK(x.dim() >= 1, "index_select: x must have at least one dimension, got shape ", shape_str(x.shape()));
  DPE_CHECK(indices.dim() <= 1, "index_select: indices must be 1-d or 0-d, got shape ", shape_str(indices.shape()));
  const int64_t d = normalize_dim(dim, x.dim(), "index_select");
  if (d != 0) {
    // Bring `dim` to the front, select rows, move it back (views; their autograd composes).
    return index_select(x.transpose(0, d), 0, indices).transpose(0, d);
  }
  const Shape in_shape = x.shape();
  const int64_t V = in_shape[0];
  const int64_t D = V > 0 ? x.numel() / V : shape_numel(Shape(in_shape.begin() + 1, in_shape.end()));
  Tensor flat = indices.reshape({-1}).contiguous();
  Tensor table = x.detach().contiguous().reshape({V, D});
  Shape out_shape = in_shape;
  out_shape[0] = flat.numel();
  Tensor out = gather_rows(table, flat).reshape(out_shape);
  autograd::record(out, {x}, "IndexSelectBackward", [flat, V, D, in_shape](const Tensor& g) -> std::vector<Tensor> {
    return {scatter_add_rows(g.reshape({-1, D}), flat, V).reshape(in_shape)};
  });
  return out;
}

// weight: (V, D)  indices: any shape  ->  (*indices.shape, D)
Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx) {
  check_compute_dtype(weight, "embedding");
  check_indices_tensor(weight, indices, "embedding");
  DPE_CHECK(weight.dim() == 2, "embedding: weight must be 2-d (num_embeddings, embedding_dim), got shape ",
            shape_str(weight.shape()));
  const int64_t V = weight.size(0), D = weight.size(1);
  std::optional<int64_t> pad = padding_idx;
  if (pad.has_value()) {
    DPE_CHECK(*pad >= -V && *pad < V, "embedding: padding_idx ", *pad, " must be within num_embeddings ", V);
    if (*pad < 0) *pad += V;
  }
  Tensor flat = indices.reshape({-1}).contiguous();
  Shape out_shape = indices.shape();
  out_shape.push_back(D);
  Tensor out = gather_rows(weight.detach().contiguous(), flat).reshape(out_shape);
  autograd::record(out, {weight}, "EmbeddingBackward", [flat, V, D, pad](const Tensor& g) -> std::vector<Tensor> {
    Tensor dw = scatter_add_rows(g.reshape({-1, D}), flat, V);
    // The padding row receives no gradient: only occurrences of padding_idx write to it.
    if (pad.has_value()) dw.narrow(0, *pad, 1).zero_();
    return {dw};
  });
  return out;
}

}  // namespace dpe
