"""Golden values for layers/autocast_golden_test.cc: PyTorch's CPU autocast in bfloat16 (torch.autocast("cpu",
dtype=torch.bfloat16)), forward and loss under autocast, backward outside it as PyTorch users write it.

Cases (one fixture, keys prefixed by case name):
  linear_*   Linear(37, 23), float32 parameters, x (16, 37) float32.
  conv_*     Conv2d(3, 8, 3, padding=1), float32 parameters, x (4, 3, 10, 10) float32.
             Both: x, weight, bias, y, dy, dx, dweight, dbias. Autocast makes y bfloat16; it is stored cast to
             float32 (exactly representable). dy is a float32 upstream gradient, fed as y.backward(dy.to(y.dtype)).
             The gradients are float32 (the float32 leaves receive them through the autocast casts' backward),
             with bfloat16-rounded values.
  mlp_*      dpe's "mlp" model (models/models.cc) in its SHAPE PATTERN but narrower so the fixture stays small:
             Sequential(Flatten, Linear(784, 64), ReLU, Linear(64, 64), ReLU, Linear(64, 10)) instead of
             784-512-512-10, batch 16 instead of 32. Keys follow the Sequential indices (Flatten is index 0):
             mlp_input (16, 1, 28, 28) from torch.rand, mlp_target (16,) int64 in [0, 10), mlp_1_weight,
             mlp_1_bias, mlp_3_weight, ..., mlp_loss (1,) = cross_entropy(logits, target) under autocast (it
             autocasts to float32), and mlp_1_weight_grad ... for every parameter.
  mlp_f32_*  The same model, input and target without autocast: mlp_f32_loss and mlp_f32_1_weight_grad ...
             (the parameters are the mlp_ ones), so a test can state how far bfloat16 is from float32 too.

Also prints (not stored) the max relative error of each bfloat16 MLP gradient against the float32 one, the numbers
AUTOCAST_GOLDEN_NOTES.md quotes. Run with Debian's PyTorch 1.13: /usr/bin/python3 tests/golden/gen_autocast.py.
"""
import torch
import torch.nn.functional as F

from golden_io import save

torch.manual_seed(0)
out = {}
AUTOCAST = dict(device_type="cpu", dtype=torch.bfloat16)


def layer_case(name, module, x_shape):
    x = torch.randn(*x_shape, requires_grad=True)
    with torch.autocast(**AUTOCAST):
        y = module(x)
    assert y.dtype == torch.bfloat16, y.dtype
    dy = torch.randn(y.shape)  # float32
    y.backward(dy.to(y.dtype))
    for g in (x.grad, module.weight.grad, module.bias.grad):
        assert g.dtype == torch.float32, g.dtype
    out.update({f"{name}_x": x, f"{name}_weight": module.weight, f"{name}_bias": module.bias,
                f"{name}_y": y.float(), f"{name}_dy": dy, f"{name}_dx": x.grad,
                f"{name}_dweight": module.weight.grad, f"{name}_dbias": module.bias.grad})


layer_case("linear", torch.nn.Linear(37, 23), (16, 37))
layer_case("conv", torch.nn.Conv2d(3, 8, 3, padding=1), (4, 3, 10, 10))

# The MLP: parameters from the seeded default init, float32.
mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                          torch.nn.ReLU(), torch.nn.Linear(64, 10))
x = torch.rand(16, 1, 28, 28)
target = torch.randint(0, 10, (16,))
names = [n.replace(".", "_") for n, _ in mlp.named_parameters()]  # 1_weight, 1_bias, 3_weight, ...
out.update({"mlp_input": x, "mlp_target": target})
out.update({f"mlp_{n}": p for n, p in zip(names, mlp.parameters())})

with torch.autocast(**AUTOCAST):
    logits = mlp(x)
    loss = F.cross_entropy(logits, target)
assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32, (logits.dtype, loss.dtype)
loss.backward()
out["mlp_loss"] = loss.detach().reshape(1)
bf16_grads = [p.grad.clone() for p in mlp.parameters()]
assert all(g.dtype == torch.float32 for g in bf16_grads)
out.update({f"mlp_{n}_grad": g for n, g in zip(names, bf16_grads)})

mlp.zero_grad(set_to_none=True)
loss32 = F.cross_entropy(mlp(x), target)
loss32.backward()
out["mlp_f32_loss"] = loss32.detach().reshape(1)
f32_grads = [p.grad.clone() for p in mlp.parameters()]
out.update({f"mlp_f32_{n}_grad": g for n, g in zip(names, f32_grads)})

save("autocast", **out)

# Documentation only: how far PyTorch's bf16 autocast is from float32 on this MLP.
print(f"loss: bf16 {loss.item():.8f}  f32 {loss32.item():.8f}  "
      f"rel err {abs(loss.item() - loss32.item()) / abs(loss32.item()):.3e}")
print(f"{'grad':<10} {'max|g32|':>10} {'max rel (floor 1e-6)':>21} {'max rel (floor max|g32|)':>25}")
for n, g16, g32 in zip(names, bf16_grads, f32_grads):
    d = (g16.double() - g32.double()).abs()
    scale = g32.double().abs().max().item()
    per_elem = (d / (g32.double().abs() + 1e-6)).max().item()
    vs_max = (d / (g32.double().abs() + scale)).max().item()
    print(f"{n:<10} {scale:>10.3e} {per_elem:>21.3e} {vs_max:>25.3e}")
