// matmul / bmm / linear on the GEMM kernel. Transposed views are passed to the GEMM as transpose flags, not
// copied. Under autocast (core/amp/autocast.h) the GEMMs read 16-bit casts of the float32 operands and write
// float32; the backward GEMMs read the same casts (saved) and the cast of the incoming gradient.
#include "core/amp/autocast.h"
#include "core/autograd/function.h"
#include "core/dispatch.h"
#include "core/kernels/matmul.h"
#include "core/ops.h"
#include "core/ops/op_checks.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#endif

namespace dpe {

using kernels::Transpose;
using detail::check_compute_dtype;
using detail::options_of;

namespace {

// How the GEMM reads the last two dimensions of a (batch, rows, cols) or (rows, cols) tensor.
struct MatrixOperand {
  Tensor storage;  // keeps a contiguous copy alive when one was needed
  Transpose trans = Transpose::No;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

MatrixOperand as_operand(const Tensor& t) {
  int64_t rows = t.size(-2), cols = t.size(-1);
  int64_t rs = t.strides()[t.dim() - 2], cs = t.strides()[t.dim() - 1];
  auto batch_stride = [](const Tensor& x) { return x.dim() == 3 && x.size(0) > 1 ? x.strides()[0] : 0; };
  if ((cs == 1 || cols == 1) && rs >= std::max<int64_t>(cols, 1)) return {t, Transpose::No, rs, batch_stride(t)};
  if ((rs == 1 || rows == 1) && cs >= std::max<int64_t>(rows, 1)) return {t, Transpose::Yes, cs, batch_stride(t)};
  Tensor packed = t.contiguous();
  return {packed, Transpose::No, std::max<int64_t>(cols, 1), batch_stride(packed)};
}

// A 2-d view whose columns are contiguous: the transpose of a row-major matrix.
bool is_transposed_matrix(const Tensor& t) {
  return t.size(0) > 1 && t.size(1) > 1 && t.strides()[0] == 1 && t.strides()[1] == t.size(0);
}

// out (batch?, m, n) = a @ b with a: (batch?, m, k), b: (batch?, k, n); no autograd. 16-bit operands give a
// float32 out.
Tensor matmul_forward(const Tensor& a, const Tensor& b) {
  int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  int64_t batch = a.dim() == 3 ? a.size(0) : (b.dim() == 3 ? b.size(0) : 1);
  Shape out_shape = a.dim() == 3 || b.dim() == 3 ? Shape{batch, m, n} : Shape{m, n};
  const DType out_dtype = a.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  Tensor out = Tensor::empty(out_shape, options_of(a).with_dtype(out_dtype));
  if (out.numel() == 0) return out;
  MatrixOperand A = as_operand(a), B = as_operand(b);
  kernels::GemmArgs args;
  args.dtype = a.dtype();
  args.trans_a = A.trans;
  args.trans_b = B.trans;
  args.m = m;
  args.n = n;
  args.k = k;
  args.a = A.storage.data_ptr();
  args.lda = A.ld;
  args.b = B.storage.data_ptr();
  args.ldb = B.ld;
  args.c = out.data_ptr();
  args.ldc = n;
  args.batch = batch;
  args.stride_a = A.batch_stride;
  args.stride_b = B.batch_stride;
  args.stride_c = m * n;
  dispatch(
      a.device(), [&] { kernels::gemm_cpu(args); },
      [&](auto stream) {
#if DPE_WITH_CUDA
        kernels::gemm_cuda(stream, cuda::cublas_handle(a.device().index), args);
#endif
      });
  return out;
}

// The operand a GEMM reads for `t`: t itself, or its cast to the autocast dtype.
Tensor gemm_operand(const Tensor& t, std::optional<DType> lowp) {
  return lowp ? amp::cast_operand(t, *lowp) : t.detach();
}

// a @ b, differentiable in a and b, with the GEMMs reading a_op and b_op (gemm_operand of a and b, or of the
// tensors a and b are views of) and, in backward, gemm_operand(g).
Tensor matmul_on(const Tensor& a, const Tensor& b, const Tensor& a_op, const Tensor& b_op, std::optional<DType> lowp);

// a @ b on gemm_operand(a) and gemm_operand(b).
Tensor matmul_as(const Tensor& a, const Tensor& b, std::optional<DType> lowp) {
  return matmul_on(a, b, gemm_operand(a, lowp), gemm_operand(b, lowp), lowp);
}

Tensor matmul_on(const Tensor& a, const Tensor& b, const Tensor& a_op, const Tensor& b_op, std::optional<DType> lowp) {
  Tensor out;
  if (a_op.dim() == 3 && b_op.dim() == 2 && a_op.is_contiguous()) {
    // (B, m, k) @ (k, n): one GEMM over B*m rows.
    Tensor flat = a_op.reshape({a_op.size(0) * a_op.size(1), a_op.size(2)});
    out = matmul_forward(flat, b_op).reshape({a_op.size(0), a_op.size(1), b_op.size(1)});
  } else {
    out = matmul_forward(a_op, b_op);
  }
  bool grad_a = a.requires_grad(), grad_b = b.requires_grad();
  // What backward reads: the operands as the GEMMs saw them (16-bit under autocast), with a's shape.
  Tensor sa = a_op, sb = b_op;
  autograd::record(out, {a, b}, "MatmulBackward",
                   [sa, sb, grad_a, grad_b, lowp](const Tensor& incoming) -> std::vector<Tensor> {
    // Under autocast the gradient is cast once for both products (unless it requires grad itself: a double
    // backward must reach it through the products).
    const Tensor g = lowp && !incoming.requires_grad() ? amp::cast_operand(incoming, *lowp) : incoming;
    Tensor ga, gb;
    if (grad_a) ga = sum_to(matmul_as(g, sb.transpose(-2, -1), lowp), sa.shape());
    if (grad_b) {
      // b's gradient a^T @ g (k, n), folded into one GEMM over the batch for a broadcast 2-d b.
      Tensor a2 = sa, g2 = g;
      if (sb.dim() == 2 && sa.dim() == 3) {
        a2 = sa.reshape({-1, sa.size(-1)});
        g2 = g.reshape({-1, g.size(-1)});
      }
      if (sb.dim() == 2 && a2.dim() == 2 && is_transposed_matrix(sb)) {
        // b is a transposed view (Linear's weight.t()): compute g^T @ a, (n, k) contiguous, and hand back its
        // transpose, so the gradient reaching the weight is contiguous and nobody copies a transpose.
        gb = matmul_as(g2.transpose(0, 1), a2, lowp).transpose(0, 1);
      } else if (sb.dim() == 2 && sa.dim() == 3) {
        gb = matmul_as(a2.transpose(0, 1), g2, lowp);
      } else {
        gb = sum_to(matmul_as(sa.transpose(-2, -1), g, lowp), sb.shape());
      }
    }
    return {ga, gb};
  });
  return out;
}

// The autocast dtype of a product of `a`'s device, for float32 operands only (float64 is for gradient checks,
// and PyTorch's autocast leaves other types alone).
std::optional<DType> autocast_dtype(const Tensor& a) {
  return a.dtype() == DType::Float32 ? amp::lower_precision_dtype(a.device()) : std::nullopt;
}

void check_matmul(const Tensor& a, const Tensor& b) {
  detail::check_same_device_and_dtype(a, b, "matmul");
  check_compute_dtype(a, "matmul");
  DPE_CHECK((a.dim() == 2 || a.dim() == 3) && (b.dim() == 2 || b.dim() == 3), "matmul: expected 2-d or 3-d operands, got ",
            shape_str(a.shape()), " and ", shape_str(b.shape()));
  DPE_CHECK(a.size(-1) == b.size(-2), "matmul: inner dimensions differ: ", shape_str(a.shape()), " @ ",
            shape_str(b.shape()), " (", a.size(-1), " vs ", b.size(-2), ")");
  if (a.dim() == 3 && b.dim() == 3) {
    DPE_CHECK(a.size(0) == b.size(0), "matmul: batch sizes differ: ", shape_str(a.shape()), " @ ",
              shape_str(b.shape()));
  }
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_matmul(a, b);
  return matmul_as(a, b, autocast_dtype(a));
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  DPE_CHECK(weight.defined() && weight.dim() == 2, "linear: expected weight (out_features, in_features), got ",
            weight.defined() ? shape_str(weight.shape()) : std::string("an undefined tensor"));
  DPE_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: expected input (..., ",
            weight.size(1), "), got ", x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  Tensor x2 = x.reshape({-1, weight.size(1)}), wt = weight.t();
  check_matmul(x2, wt);
  const std::optional<DType> lowp = autocast_dtype(x2);
  // The weight itself is cast (a parameter: the autocast cast cache applies), then viewed transposed.
  Tensor y = matmul_on(x2, wt, gemm_operand(x2, lowp), gemm_operand(weight, lowp).t(), lowp);
  if (bias.defined()) y = y + bias;
  Shape out_shape = x.shape();
  out_shape.back() = weight.size(0);
  return y.reshape(out_shape);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  DPE_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-d operands, got ", shape_str(a.shape()), " and ",
            shape_str(b.shape()));
  return matmul(a, b);
}

}  // namespace dpe
