#include "layers/pooling.h"

#include "core/error.h"
#include "core/ops/pool.h"

namespace dpe::nn {

namespace {

// Window arguments are checked at construction, so a bad layer fails where it is built.
void check_window(const char* layer, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  DPE_CHECK(kernel[0] > 0 && kernel[1] > 0 && stride[0] > 0 && stride[1] > 0, layer, ": kernel (", kernel[0], ", ",
            kernel[1], ") and stride (", stride[0], ", ", stride[1], ") must be positive");
  DPE_CHECK(padding[0] >= 0 && padding[1] >= 0 && 2 * padding[0] <= kernel[0] && 2 * padding[1] <= kernel[1], layer,
            ": padding (", padding[0], ", ", padding[1], ") must be >= 0 and at most half the kernel (", kernel[0],
            ", ", kernel[1], ")");
}

std::array<int64_t, 2> square(int64_t v) { return {v, v}; }

}  // namespace

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : MaxPool2d(square(kernel), square(stride == -1 ? kernel : stride), square(padding)) {}

MaxPool2d::MaxPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride, std::array<int64_t, 2> padding)
    : Cloneable("MaxPool2d"), kernel(kernel), stride(stride), padding(padding) {
  check_window("MaxPool2d", kernel, stride, padding);
}

Tensor MaxPool2d::forward(const Tensor& x) { return max_pool2d(x, kernel, stride, padding); }

AvgPool2d::AvgPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : AvgPool2d(square(kernel), square(stride == -1 ? kernel : stride), square(padding)) {}

AvgPool2d::AvgPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride, std::array<int64_t, 2> padding)
    : Cloneable("AvgPool2d"), kernel(kernel), stride(stride), padding(padding) {
  check_window("AvgPool2d", kernel, stride, padding);
}

Tensor AvgPool2d::forward(const Tensor& x) { return avg_pool2d(x, kernel, stride, padding); }

AdaptiveAvgPool2d::AdaptiveAvgPool2d(std::array<int64_t, 2> output_size)
    : Cloneable("AdaptiveAvgPool2d"), output_size(output_size) {
  DPE_CHECK(output_size[0] > 0 && output_size[1] > 0, "AdaptiveAvgPool2d: output_size (", output_size[0], ", ",
            output_size[1], ") must be positive");
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return adaptive_avg_pool2d(x, output_size); }

}  // namespace dpe::nn
