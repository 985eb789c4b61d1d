#include "layers/conv.h"

#include <string>

#include "core/error.h"
#include "core/ops/conv.h"
#include "layers/init.h"

namespace dpe::nn {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride, int64_t padding)
    : Conv2d(Conv2dOptions{
          in_channels, out_channels, {kernel_size, kernel_size}, {stride, stride}, {padding, padding}}) {}

Conv2d::Conv2d(Conv2dOptions options) : Cloneable("Conv2d"), options_(options) {
  const Conv2dOptions& o = options_;
  DPE_CHECK(o.in_channels > 0 && o.out_channels > 0, "Conv2d(", o.in_channels, ", ", o.out_channels,
            "): channel counts must be positive");
  DPE_CHECK(o.groups > 0 && o.in_channels % o.groups == 0 && o.out_channels % o.groups == 0, "Conv2d(",
            o.in_channels, ", ", o.out_channels, "): groups=", o.groups, " must divide both channel counts");
  DPE_CHECK(o.kernel_size[0] > 0 && o.kernel_size[1] > 0 && o.stride[0] > 0 && o.stride[1] > 0 &&
                o.dilation[0] > 0 && o.dilation[1] > 0 && o.padding[0] >= 0 && o.padding[1] >= 0,
            "Conv2d(", o.in_channels, ", ", o.out_channels, "): kernel_size (", o.kernel_size[0], ", ",
            o.kernel_size[1], "), stride (", o.stride[0], ", ", o.stride[1], ") and dilation (", o.dilation[0], ", ",
            o.dilation[1], ") must be positive, padding (", o.padding[0], ", ", o.padding[1], ") non-negative");
  reset();
}

void Conv2d::reset() {
  const Conv2dOptions& o = options_;
  TensorOptions opts = o.tensor_options.with_requires_grad(false);
  weight = register_parameter(
      "weight", Tensor::empty({o.out_channels, o.in_channels / o.groups, o.kernel_size[0], o.kernel_size[1]}, opts));
  const int64_t fan_in = init::fan_in(weight);  // in_channels / groups * kH * kW
  init::uniform_fan_in_(weight, fan_in);
  bias = Tensor();
  if (o.bias) {
    bias = register_parameter("bias", Tensor::empty({o.out_channels}, opts));
    init::uniform_fan_in_(bias, fan_in);
  }
}

void Conv2d::check_input(const Tensor& x) const {
  const Conv2dOptions& o = options_;
  DPE_CHECK(x.defined() && (x.dim() == 4 || x.dim() == 3) && x.size(-3) == o.in_channels, "Conv2d(", o.in_channels,
            ", ", o.out_channels, "): expected input (N, C_in=", o.in_channels, ", H, W), got ",
            x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
}

Tensor Conv2d::forward(const Tensor& x) {
  check_input(x);
  const Conv2dOptions& o = options_;
  return conv2d(x, weight, bias, o.stride, o.padding, o.dilation, o.groups);
}

}  // namespace dpe::nn
