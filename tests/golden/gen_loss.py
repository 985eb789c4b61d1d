"""Golden values for layers/loss_test.cc: cross_entropy, nll_loss, mse_loss (forward and input gradients)."""
import torch
import torch.nn.functional as F

from golden_io import save

torch.manual_seed(0)
out = {}


def case(prefix, fn, x, *rest, dy_shape=None):
    """Runs fn(x, *rest), backprops a random upstream gradient and records y, dy, dx."""
    x = x.clone().requires_grad_(True)
    y = fn(x, *rest)
    dy = torch.randn(y.shape, dtype=torch.float64)
    y.backward(dy)
    out[prefix + "_y"] = y
    out[prefix + "_dy"] = dy
    out[prefix + "_dx"] = x.grad


logits = torch.randn(6, 5, dtype=torch.float64)
target = torch.tensor([0, 4, 2, -100, 1, 3])
out["logits"] = logits
out["target"] = target
for red in ["mean", "sum", "none"]:
    case(f"ce_{red}", lambda x, t: F.cross_entropy(x, t, reduction=red), logits, target)
    case(f"ce_ls_{red}", lambda x, t: F.cross_entropy(x, t, reduction=red, label_smoothing=0.2), logits, target)
    case(f"nll_{red}", lambda x, t: F.nll_loss(x, t, reduction=red), logits.log_softmax(1), target)
out["log_probs"] = logits.log_softmax(1)
case("ce_ignore3", lambda x, t: F.cross_entropy(x, t, ignore_index=3), logits, torch.tensor([0, 4, 2, 3, 1, 3]))
out["target_ignore3"] = torch.tensor([0, 4, 2, 3, 1, 3])

# (N, C, d1, d2) with some ignored positions.
logits4 = torch.randn(2, 4, 3, 2, dtype=torch.float64)
target4 = torch.randint(0, 4, (2, 3, 2))
target4[0, 1, 0] = -100
target4[1, 2, 1] = -100
out["logits4"] = logits4
out["target4"] = target4
for red in ["mean", "sum", "none"]:
    case(f"ce4_{red}", lambda x, t: F.cross_entropy(x, t, reduction=red), logits4, target4)
    case(f"ce4_ls_{red}", lambda x, t: F.cross_entropy(x, t, reduction=red, label_smoothing=0.1), logits4, target4)

# Every target ignored: torch 1.13 returns NaN for mean, 0 for sum.
all_ignored = torch.full((3,), -100)
out["all_ignored_mean"] = F.cross_entropy(logits[:3], all_ignored)
out["all_ignored_sum"] = F.cross_entropy(logits[:3], all_ignored, reduction="sum")
out["all_ignored_ls_mean"] = F.cross_entropy(logits[:3], all_ignored, label_smoothing=0.1)

a = torch.randn(4, 3, dtype=torch.float64)
b = torch.randn(4, 3, dtype=torch.float64)
out["mse_a"] = a
out["mse_b"] = b
for red in ["mean", "sum", "none"]:
    case(f"mse_{red}", lambda x, t: F.mse_loss(x, t, reduction=red), a, b)

save("loss", **out)
print("all_ignored:", out["all_ignored_mean"].item(), out["all_ignored_sum"].item(),
      out["all_ignored_ls_mean"].item())
