"""Golden values for layers/linear_test.cc (the example every gen_*.py follows)."""
import torch

from golden_io import save

torch.manual_seed(0)
fc = torch.nn.Linear(5, 3).double()
x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
y = fc(x)
dy = torch.randn_like(y)
y.backward(dy)
save("linear", x=x, weight=fc.weight, bias=fc.bias, y=y, dy=dy, dx=x.grad, dweight=fc.weight.grad, dbias=fc.bias.grad)
