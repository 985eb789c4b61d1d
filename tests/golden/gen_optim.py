"""Golden values for optim/*_test.cc: SGD/Adam/AdamW trajectories, LR schedulers, clip_grad_norm_.

Optimizers: three float64 parameters, a fixed sequence of 5 gradients; parameter 2 has no gradient at step 2
(PyTorch skips it). Fixtures: p<i> (initial values), g<s>_<i> (gradient of step s), <config>_s<s>_p<i> (the
parameter after step s).
"""
import torch

from golden_io import save

torch.manual_seed(0)
out = {}
shapes = [(3, 4), (4,), (2, 2)]
STEPS = 5
params0 = [torch.randn(s, dtype=torch.float64) for s in shapes]
grads = [[torch.randn(s, dtype=torch.float64) for s in shapes] for _ in range(STEPS)]
for i, p in enumerate(params0):
    out[f"p{i}"] = p
for s in range(STEPS):
    for i in range(len(shapes)):
        out[f"g{s}_{i}"] = grads[s][i]


def has_grad(s, i):
    return not (s == 2 and i == 2)


configs = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "sgd_dampening": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.3),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "sgd_wd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5, weight_decay=0.01),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adam_wd": lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}
for name, make in configs.items():
    ps = [p.clone().requires_grad_(True) for p in params0]
    opt = make(ps)
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        for i, p in enumerate(ps):
            if has_grad(s, i):
                p.grad = grads[s][i].clone()
        opt.step()
        for i, p in enumerate(ps):
            out[f"{name}_s{s}_p{i}"] = p.detach().clone()

# Schedulers: two param groups (lr 0.1 and 0.02); the lrs after construction and after each of 12 steps.
def lrs_of(make_sched, n=12):
    w = [torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)]
    opt = torch.optim.SGD([{"params": [w[0]], "lr": 0.1}, {"params": [w[1]], "lr": 0.02}], lr=0.1)
    sched = make_sched(opt)
    rows = [sched.get_last_lr()]
    for _ in range(n):
        opt.step()
        sched.step()
        rows.append(sched.get_last_lr())
    return torch.tensor(rows, dtype=torch.float64)


out["steplr"] = lrs_of(lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5))
out["multisteplr"] = lrs_of(lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[2, 5, 5, 9], gamma=0.3))

# clip_grad_norm_: three gradients; max_norm 1 (clips) and 100 (does not) for p = 2, 1, 3, inf.
clip_grads = [torch.randn(s, dtype=torch.float64) * 2 for s in shapes]
for i, g in enumerate(clip_grads):
    out[f"clip_g{i}"] = g
for tag, norm_type in [("2", 2.0), ("1", 1.0), ("3", 3.0), ("inf", float("inf"))]:
    for max_norm in [1.0, 100.0]:
        ps = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in shapes]
        for p, g in zip(ps, clip_grads):
            p.grad = g.clone()
        total = torch.nn.utils.clip_grad_norm_(ps, max_norm, norm_type)
        key = f"clip_{tag}_{int(max_norm)}"
        out[key + "_total"] = total.to(torch.float64)
        for i, p in enumerate(ps):
            out[f"{key}_g{i}"] = p.grad

save("optim", **out)
