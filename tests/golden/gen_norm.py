"""Golden values for the normalization / embedding tests (layers/batchnorm_test.cc, normalization_test.cc,
embedding_test.cc): BatchNorm1d/2d train-mode outputs, gradients and updated running stats, eval outputs;
LayerNorm; RMSNorm (by hand: torch 1.13 has no nn.RMSNorm); Embedding with padding_idx."""
import torch

from golden_io import save

torch.manual_seed(0)


def batchnorm_case(bn, shapes):
    """Two training steps (running stats accumulate), then eval on a fresh input."""
    bn = bn.double()
    with torch.no_grad():
        bn.weight.copy_(torch.rand_like(bn.weight) + 0.5)
        bn.bias.copy_(torch.randn_like(bn.bias))
    out = {"weight": bn.weight.detach().clone(), "bias": bn.bias.detach().clone()}
    bn.train()
    for step, shape in enumerate(shapes[:2]):
        bn.zero_grad()
        x = (torch.randn(*shape, dtype=torch.float64) * 2 + 1).requires_grad_(True)
        y = bn(x)
        dy = torch.randn_like(y)
        y.backward(dy)
        out.update({f"x{step}": x, f"y{step}": y, f"dy{step}": dy, f"dx{step}": x.grad,
                    f"dweight{step}": bn.weight.grad.clone(), f"dbias{step}": bn.bias.grad.clone(),
                    f"running_mean{step}": bn.running_mean.clone(), f"running_var{step}": bn.running_var.clone(),
                    f"num_batches_tracked{step}": bn.num_batches_tracked.clone()})
    bn.eval()
    x = torch.randn(*shapes[2], dtype=torch.float64)
    out.update({"x_eval": x, "y_eval": bn(x)})
    return out


save("batchnorm1d", **batchnorm_case(torch.nn.BatchNorm1d(3), [(6, 3), (6, 3), (5, 3)]))
save("batchnorm1d_3d", **batchnorm_case(torch.nn.BatchNorm1d(3, momentum=0.3), [(4, 3, 5), (4, 3, 5), (2, 3, 5)]))
save("batchnorm2d", **batchnorm_case(torch.nn.BatchNorm2d(4, eps=1e-3), [(3, 4, 5, 6), (3, 4, 5, 6), (2, 4, 5, 6)]))

# LayerNorm over the last two dims, float64, random affine.
ln = torch.nn.LayerNorm([4, 5]).double()
with torch.no_grad():
    ln.weight.copy_(torch.randn_like(ln.weight))
    ln.bias.copy_(torch.randn_like(ln.bias))
x = (torch.randn(3, 4, 5, dtype=torch.float64) * 3 - 1).requires_grad_(True)
y = ln(x)
dy = torch.randn_like(y)
y.backward(dy)
save("layernorm", x=x, weight=ln.weight, bias=ln.bias, y=y, dy=dy, dx=x.grad, dweight=ln.weight.grad,
     dbias=ln.bias.grad)

# LayerNorm in float32 (1e-5 relative in the C++ test).
ln32 = torch.nn.LayerNorm(8)
x = torch.randn(4, 8, requires_grad=True)
y = ln32(x)
dy = torch.randn_like(y)
y.backward(dy)
save("layernorm_f32", x=x, y=y, dy=dy, dx=x.grad, dweight=ln32.weight.grad, dbias=ln32.bias.grad)

# RMSNorm (Llama / torch.nn.RMSNorm), written out: y = x * rsqrt(mean(x^2, -1) + eps) * weight.
eps = 1e-6
w = (torch.rand(6, dtype=torch.float64) + 0.5).requires_grad_(True)
x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
dy = torch.randn_like(y)
y.backward(dy)
save("rmsnorm", x=x, weight=w, y=y, dy=dy, dx=x.grad, dweight=w.grad)

# Embedding with padding_idx and repeated indices.
emb = torch.nn.Embedding(10, 4, padding_idx=2).double()
idx = torch.tensor([[1, 2, 3, 1], [9, 2, 0, 1], [5, 5, 5, 7]], dtype=torch.int64)
y = emb(idx)
dy = torch.randn_like(y)
y.backward(dy)
save("embedding", weight=emb.weight, indices=idx, y=y, dy=dy, dweight=emb.weight.grad)
