#include "tests/testing/kernel_test_util.h"

namespace dpe::kernels {

Layout make_layout(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  Layout l;
  l.ndim = static_cast<int>(sizes.size());
  for (int d = 0; d < l.ndim; ++d) {
    l.sizes[d] = sizes[d];
    l.strides[d] = strides[d];
  }
  return l;
}

Layout contiguous(const std::vector<int64_t>& sizes) {
  return contiguous_layout(static_cast<int>(sizes.size()), sizes.data());
}

int64_t extent(const Layout& l) {
  int64_t e = 1;
  for (int d = 0; d < l.ndim; ++d) {
    if (l.sizes[d] == 0) return 0;
    e += (l.sizes[d] - 1) * l.strides[d];
  }
  return e;
}

}  // namespace dpe::kernels
