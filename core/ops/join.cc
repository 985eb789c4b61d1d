// cat and stack, with backward (narrowing the gradient back into pieces).
#include "core/autograd/function.h"
#include "core/copy.h"
#include "core/ops.h"
#include "core/ops/op_checks.h"

namespace dpe {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  DPE_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  const Tensor& first = tensors[0];
  int64_t d = normalize_dim(dim, first.dim(), "cat");
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    detail::check_same_device_and_dtype(first, t, "cat");
    DPE_CHECK(t.dim() == first.dim(), "cat: tensor ", i, " has shape ", shape_str(t.shape()), ", tensor 0 has ",
              shape_str(first.shape()), " (different number of dimensions)");
    for (int64_t k = 0; k < t.dim(); ++k) {
      DPE_CHECK(k == d || t.shape()[k] == first.shape()[k], "cat: tensor ", i, " has shape ", shape_str(t.shape()),
                " but tensor 0 has ", shape_str(first.shape()), "; they may differ only in dimension ", d);
    }
    out_shape[d] += t.shape()[d];
  }
  Tensor out = Tensor::empty(out_shape, detail::options_of(first));
  std::vector<int64_t> sizes;
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    copy_into(out.narrow(d, offset, t.shape()[d]), t);
    offset += t.shape()[d];
    sizes.push_back(t.shape()[d]);
  }
  autograd::record(out, tensors, "CatBackward", [sizes, d](const Tensor& g) -> std::vector<Tensor> {
    return g.split(sizes, d);
  });
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  DPE_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  int64_t d = normalize_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  for (const Tensor& t : tensors) {
    DPE_CHECK(t.shape() == tensors[0].shape(), "stack: tensors must have the same shape, got ",
              shape_str(tensors[0].shape()), " and ", shape_str(t.shape()));
    expanded.push_back(t.unsqueeze(d));
  }
  return cat(expanded, d);
}

}  // namespace dpe
