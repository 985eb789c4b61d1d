"""Golden values for layers/conv_test.cc: Conv2d (several configurations, float64 and float32), MaxPool2d,
AvgPool2d and AdaptiveAvgPool2d, forward and backward. One fixture, keys prefixed by case name."""
import torch

from golden_io import save

torch.manual_seed(0)
out = {}


def conv_case(name, dtype, x_shape, *args, **kwargs):
    conv = torch.nn.Conv2d(*args, **kwargs).to(dtype)
    x = torch.randn(*x_shape, dtype=dtype, requires_grad=True)
    y = conv(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    out.update({f"{name}_x": x, f"{name}_weight": conv.weight, f"{name}_y": y, f"{name}_dy": dy,
                f"{name}_dx": x.grad, f"{name}_dweight": conv.weight.grad})
    if conv.bias is not None:
        out.update({f"{name}_bias": conv.bias, f"{name}_dbias": conv.bias.grad})


def pool_case(name, dtype, x_shape, module):
    x = torch.randn(*x_shape, dtype=dtype, requires_grad=True)
    y = module(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    out.update({f"{name}_x": x, f"{name}_y": y, f"{name}_dy": dy, f"{name}_dx": x.grad})


f64, f32 = torch.float64, torch.float32
conv_case("plain", f64, (2, 3, 6, 5), 3, 4, 3, stride=1, padding=1)
conv_case("grouped", f64, (2, 4, 9, 7), 4, 6, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(2, 1), groups=2)
conv_case("depthwise", f64, (1, 3, 5, 5), 3, 3, 3, padding=1, groups=3, bias=False)
conv_case("strided32", f32, (2, 3, 8, 8), 3, 8, 3, stride=2, padding=1)
pool_case("maxpool", f64, (2, 3, 7, 6), torch.nn.MaxPool2d(3, 2, 1))
pool_case("maxpool_rect", f64, (2, 2, 6, 7), torch.nn.MaxPool2d((2, 3), (1, 2), (1, 1)))
pool_case("avgpool", f64, (2, 3, 7, 6), torch.nn.AvgPool2d(3, 2, 1))
pool_case("avgpool_rect", f64, (2, 2, 6, 7), torch.nn.AvgPool2d((2, 3), (1, 2), (1, 1)))
pool_case("adaptive", f64, (2, 3, 7, 6), torch.nn.AdaptiveAvgPool2d((3, 4)))
pool_case("adaptive_up", f64, (1, 2, 3, 5), torch.nn.AdaptiveAvgPool2d((4, 7)))
pool_case("maxpool32", f32, (2, 3, 8, 8), torch.nn.MaxPool2d(2))
pool_case("avgpool32", f32, (2, 3, 8, 8), torch.nn.AvgPool2d(3, 1, 1))
pool_case("adaptive32", f32, (2, 3, 8, 8), torch.nn.AdaptiveAvgPool2d((1, 1)))
save("conv", **out)
