"""Golden 20-step loss curves for tests/golden_curves/curves_test.cc (float32, PyTorch 1.13).

Two models from one fixed initialisation each, trained on fixed synthetic data (all exported):
  mlp: Linear(32, 64) -> ReLU -> Linear(64, 10)                     names fc1.*, fc2.*
  cnn: Conv2d(1, 4, 3) -> ReLU -> MaxPool2d(2) -> flatten -> Linear(36, 10) on (N, 1, 8, 8)   names conv.*, fc.*
each with two optimizers:
  sgd:   SGD(lr=0.1, momentum=0.9)
  adamw: AdamW(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
Step s (0..19) uses minibatch s % 4 (16 samples) of 64, loss = cross_entropy (mean), recorded before the
optimizer step. Fixture "curves": <model>.x, <model>.y, <model>.init.<param>, <model>_<opt>.loss (20),
<model>_<opt>.final.<param> (after 20 steps).
"""
import torch
import torch.nn.functional as F

from golden_io import save

STEPS, BATCH, N = 20, 16, 64


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.fc = torch.nn.Linear(36, 10)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1))


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
}

out = {}
torch.manual_seed(0)
for name, cls, xshape in [("mlp", Mlp, (N, 32)), ("cnn", Cnn, (N, 1, 8, 8))]:
    init = cls()
    x = torch.randn(*xshape)
    y = torch.randint(0, 10, (N,))
    out[f"{name}.x"] = x
    out[f"{name}.y"] = y
    for pname, p in init.state_dict().items():
        out[f"{name}.init.{pname}"] = p
    for oname, make_opt in OPTIMIZERS.items():
        model = cls()
        model.load_state_dict(init.state_dict())
        opt = make_opt(model.parameters())
        losses = []
        for step in range(STEPS):
            b = step % (N // BATCH)
            xb, yb = x[b * BATCH:(b + 1) * BATCH], y[b * BATCH:(b + 1) * BATCH]
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            losses.append(loss.item())
            opt.step()
        out[f"{name}_{oname}.loss"] = torch.tensor(losses, dtype=torch.float32)
        for pname, p in model.state_dict().items():
            out[f"{name}_{oname}.final.{pname}"] = p
        print(name, oname, " ".join(f"{l:.4f}" for l in losses))

save("curves", **out)
