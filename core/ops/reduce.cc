// Reductions (sum, mean, max, min, argmax) and sum_to, with backward.
#include <algorithm>

#include "core/autograd/function.h"
#include "core/dispatch.h"
#include "core/kernels/reduce.h"
#include "core/ops.h"
#include "core/ops/axis.h"
#include "core/ops/op_checks.h"

namespace dpe {

using kernels::AxisReduction;
using detail::check_compute_dtype;
using detail::Axis;
using detail::axis_of;
using detail::options_of;

namespace {

Shape reduced_shape(const Shape& shape, int64_t d, bool keepdim) {
  Shape out = shape;
  if (keepdim) {
    out[d] = 1;
  } else {
    out.erase(out.begin() + d);
  }
  return out;
}

// AxisReduction of x along d (or everything when all) into a new tensor; no autograd.
Tensor reduce_forward(AxisReduction op, const Tensor& x, std::optional<int64_t> dim, bool keepdim, const char* name) {
  check_compute_dtype(x, name);
  Tensor in = x.contiguous();
  Axis axis{1, x.numel(), 1};
  Shape out_shape{};
  if (dim.has_value() && x.dim() > 0) {
    axis = axis_of(x.shape(), *dim);
    out_shape = reduced_shape(x.shape(), *dim, keepdim);
  }
  if (op != AxisReduction::Sum) {
    DPE_CHECK(axis.size > 0, name, ": cannot reduce over an empty dimension (shape ", shape_str(x.shape()), ")");
  }
  Tensor out = Tensor::empty(out_shape, options_of(x));
  if (out.numel() == 0) return out;
  dispatch(
      x.device(),
      [&] { kernels::reduce_cpu(op, x.dtype(), axis.outer, axis.size, axis.inner, in.data_ptr(), out.data_ptr()); },
      [&](auto stream) {
        kernels::reduce_cuda(stream, op, x.dtype(), axis.outer, axis.size, axis.inner, in.data_ptr(),
                             out.data_ptr());
      });
  return out;
}

// g has the reduced shape of `input_shape` along d: brings it back to input_shape (a broadcast view).
Tensor expand_reduced(const Tensor& g, const Shape& input_shape, std::optional<int64_t> dim, bool keepdim) {
  Tensor grad = g;
  if (!dim.has_value()) {
    grad = g.reshape(Shape(input_shape.size(), 1));
  } else if (!keepdim && !input_shape.empty()) {
    grad = g.unsqueeze(*dim);
  }
  return grad.expand(input_shape);
}

Tensor sum_impl(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  if (dim.has_value()) dim = normalize_dim(*dim, x.dim(), "sum");
  Tensor out = reduce_forward(AxisReduction::Sum, x, dim, keepdim, "sum");
  Shape input_shape = x.shape();
  autograd::record(out, {x}, "SumBackward", [input_shape, dim, keepdim](const Tensor& g) -> std::vector<Tensor> {
    return {expand_reduced(g, input_shape, dim, keepdim)};
  });
  return out;
}

Tensor mean_impl(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  if (dim.has_value()) dim = normalize_dim(*dim, x.dim(), "mean");
  Tensor out = reduce_forward(AxisReduction::Mean, x, dim, keepdim, "mean");
  Shape input_shape = x.shape();
  double count = dim.has_value() && x.dim() > 0 ? static_cast<double>(x.shape()[*dim]) : static_cast<double>(x.numel());
  autograd::record(out, {x}, "MeanBackward",
                   [input_shape, dim, keepdim, count](const Tensor& g) -> std::vector<Tensor> {
                     return {expand_reduced(mul(g, 1.0 / count), input_shape, dim, keepdim)};
                   });
  return out;
}

Tensor argmax_forward(const Tensor& x, int64_t d, bool keepdim) {
  check_compute_dtype(x, "argmax");
  Axis axis = axis_of(x.shape(), d);
  DPE_CHECK(axis.size > 0, "argmax: cannot reduce over an empty dimension (shape ", shape_str(x.shape()), ")");
  Tensor in = x.contiguous();
  Tensor out = Tensor::empty(reduced_shape(x.shape(), d, keepdim), TensorOptions(DType::Int64).with_device(x.device()));
  if (out.numel() == 0) return out;
  dispatch(
      x.device(),
      [&] { kernels::argmax_cpu(x.dtype(), axis.outer, axis.size, axis.inner, in.data_ptr(), out.data<int64_t>()); },
      [&](auto stream) {
        kernels::argmax_cuda(stream, x.dtype(), axis.outer, axis.size, axis.inner, in.data_ptr(),
                             out.data<int64_t>());
      });
  return out;
}

// Gradient of a max/min selection: g placed at `indices` along dim d of a zero tensor of input_shape.
// Note [selection backward on the host]: dpe has no scatter kernel yet; the scatter runs on the host and
// the result is copied back. Max over a dim is not on any training hot path (max-pooling has its own kernels).
Tensor scatter_selected(const Tensor& g, const Tensor& indices, const Shape& input_shape, int64_t d) {
  Axis axis = axis_of(input_shape, d);
  std::vector<double> grad(static_cast<size_t>(shape_numel(input_shape)), 0.0);
  std::vector<double> values = g.to_vector<double>();
  std::vector<int64_t> where = indices.to_vector<int64_t>();
  for (int64_t o = 0; o < axis.outer; ++o) {
    for (int64_t i = 0; i < axis.inner; ++i) {
      int64_t r = o * axis.inner + i;
      grad[(o * axis.size + where[r]) * axis.inner + i] += values[r];
    }
  }
  return Tensor::from_vector(grad, input_shape, TensorOptions(g.dtype()).with_device(g.device()));
}

Tensor select_all(AxisReduction op, const Tensor& x, const char* name) {
  Tensor out = reduce_forward(op, x, std::nullopt, false, name);
  Shape input_shape = x.shape();
  Tensor saved = x.detach();
  autograd::record(out, {x}, std::string(name) + "Backward", [saved, input_shape, op](const Tensor& g) -> std::vector<Tensor> {
    Tensor flat = saved.reshape({-1});
    Tensor index = argmax_forward(op == AxisReduction::Max ? flat : neg(flat), 0, false);
    return {scatter_selected(g.reshape({}), index, {flat.numel()}, 0).reshape(input_shape)};
  });
  return out;
}

}  // namespace

Tensor sum(const Tensor& x) { return sum_impl(x, std::nullopt, false); }
Tensor sum(const Tensor& x, int64_t dim, bool keepdim) { return sum_impl(x, dim, keepdim); }

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  std::vector<int64_t> sorted;
  for (int64_t d : dims) sorted.push_back(normalize_dim(d, x.dim(), "sum"));
  std::sort(sorted.rbegin(), sorted.rend());
  DPE_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), "sum: a dimension repeats in the list");
  // Highest first keeps lower indices valid. A run of adjacent dimensions is one reduction over their
  // product: a convolution's bias gradient, sum(dy, {0, 2, 3}), sums each H x W plane in one pass instead of
  // W-long rows and then H-long columns (bench/cnn_kernels_bench, one core: 0.64 -> 0.12 ms for the CNN's
  // 64 x 64 x 14 x 14).
  Tensor out = x;
  for (size_t i = 0; i < sorted.size();) {
    const int64_t hi = sorted[i];
    int64_t lo = hi;
    for (++i; i < sorted.size() && sorted[i] == lo - 1; ++i) lo = sorted[i];
    if (lo == hi) {
      out = sum_impl(out, hi, keepdim);
      continue;
    }
    Shape merged(out.shape().begin(), out.shape().begin() + lo);
    merged.push_back(shape_numel(Shape(out.shape().begin() + lo, out.shape().begin() + hi + 1)));
    merged.insert(merged.end(), out.shape().begin() + hi + 1, out.shape().end());
    Shape result = out.shape();
    out = sum_impl(out.reshape(merged), lo, false);
    if (keepdim) {
      std::fill(result.begin() + lo, result.begin() + hi + 1, 1);
    } else {
      result.erase(result.begin() + lo, result.begin() + hi + 1);
    }
    out = out.reshape(result);
  }
  return out;
}

Tensor mean(const Tensor& x) { return mean_impl(x, std::nullopt, false); }
Tensor mean(const Tensor& x, int64_t dim, bool keepdim) { return mean_impl(x, dim, keepdim); }
Tensor max(const Tensor& x) { return select_all(AxisReduction::Max, x, "max"); }
Tensor min(const Tensor& x) { return select_all(AxisReduction::Min, x, "min"); }

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) {
  dim = normalize_dim(dim, x.dim(), "max");
  Tensor values = reduce_forward(AxisReduction::Max, x, dim, keepdim, "max");
  Tensor indices = argmax_forward(x, dim, keepdim);
  Shape input_shape = x.shape();
  autograd::record(values, {x}, "MaxBackward", [indices, input_shape, dim](const Tensor& g) -> std::vector<Tensor> {
    return {scatter_selected(g, indices, input_shape, dim)};
  });
  return {values, indices};
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return argmax_forward(x, normalize_dim(dim, x.dim(), "argmax"), keepdim);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  DPE_CHECK(static_cast<int64_t>(shape.size()) <= x.dim(), "sum_to: cannot sum ", shape_str(x.shape()), " to ",
            shape_str(shape));
  int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i < lead) {
      dims.push_back(i);
    } else if (shape[i - lead] == 1 && x.shape()[i] != 1) {
      dims.push_back(i);
    } else {
      DPE_CHECK(shape[i - lead] == x.shape()[i], "sum_to: cannot sum ", shape_str(x.shape()), " to ",
                shape_str(shape));
    }
  }
  return sum(x, dims, true).reshape(shape);
}

}  // namespace dpe
