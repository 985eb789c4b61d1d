"""Golden values for layers/attention_test.cc and layers/llama_test.cc.

A reference causal self-attention with rotary embeddings (HF Llama's rotate_half convention), a key padding
mask and grouped-query attention (HF's repeat_kv; PyTorch 1.13 has no GQA helper), and small Llamas, written
with plain torch ops. Conventions shared with dpe (layers/attention.h, layers/llama.h):
  - RoPE tables computed in float64, then cast to the model dtype; positions 0..T-1 whatever the padding.
  - key j visible to query i iff j <= i and mask[b, j] != 0; masked scores are -inf; a query row with no
    visible key outputs zeros (its probabilities are zeroed).
  - grouped-query attention: wk, wv are (num_kv_heads * head_dim, dim); query head h reads key/value head
    h // (num_heads // num_kv_heads).
  - parameter names are Meta's Llama names ("layers.0.attention.wq.weight", ...).
Fixtures: attention.golden, llama.golden (multi-head), llama_gqa.golden (grouped-query, with a loss).
Keys: "p.<name>" parameters, "g.<name>" / "g_<tag>.<name>" gradients.
"""
import math

import torch
import torch.nn.functional as F

from golden_io import save


def rotary_tables(T, d, theta, dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)  # (T, d/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (T, d)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def repeat_kv(x, n_rep):
    # HF Llama's repeat_kv: (B, KV, T, hd) -> (B, KV * n_rep, T, hd), each key/value head n_rep times in place.
    if n_rep == 1:
        return x
    B, KV, T, hd = x.shape
    return x[:, :, None, :, :].expand(B, KV, n_rep, T, hd).reshape(B, KV * n_rep, T, hd)


def attention(x, p, prefix, num_heads, mask=None, theta=10000.0, num_kv_heads=None):
    # x: (B, T, dim)  mask: (B, T) or None; num_kv_heads None: num_heads
    B, T, dim = x.shape
    hd = dim // num_heads
    kv = num_heads if num_kv_heads is None else num_kv_heads
    q = F.linear(x, p[prefix + "wq.weight"]).view(B, T, num_heads, hd).transpose(1, 2)
    k = F.linear(x, p[prefix + "wk.weight"]).view(B, T, kv, hd).transpose(1, 2)
    v = F.linear(x, p[prefix + "wv.weight"]).view(B, T, kv, hd).transpose(1, 2)
    cos, sin = rotary_tables(T, hd, theta, x.dtype)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k, v = repeat_kv(k, num_heads // kv), repeat_kv(v, num_heads // kv)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, H, T, T)
    visible = torch.ones(T, T, dtype=torch.bool).tril()[None, None]  # (1, 1, T, T)
    if mask is not None:
        visible = visible & (mask != 0)[:, None, None, :]
    visible = visible.expand(B, 1, T, T)
    row_has = visible.any(dim=-1, keepdim=True)  # (B, 1, T, 1)
    scores = scores.masked_fill(~visible, float("-inf")).masked_fill(~row_has, 0.0)
    probs = torch.softmax(scores, dim=-1) * row_has.to(x.dtype)
    out = (probs @ v).transpose(1, 2).reshape(B, T, dim)
    return F.linear(out, p[prefix + "wo.weight"])


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def llama(tokens, p, cfg, mask=None):
    h = F.embedding(tokens, p["tok_embeddings.weight"])
    for i in range(cfg["num_layers"]):
        pre = f"layers.{i}."
        h = h + attention(rms_norm(h, p[pre + "attention_norm.weight"], cfg["eps"]), p, pre + "attention.",
                          cfg["num_heads"], mask, num_kv_heads=cfg.get("num_kv_heads"))
        n = rms_norm(h, p[pre + "ffn_norm.weight"], cfg["eps"])
        ff = pre + "feed_forward."
        h = h + F.linear(F.silu(F.linear(n, p[ff + "w1.weight"])) * F.linear(n, p[ff + "w3.weight"]), p[ff + "w2.weight"])
    return F.linear(rms_norm(h, p["norm.weight"], cfg["eps"]), p["output.weight"])


def leaf(t):
    return t.detach().clone().requires_grad_(True)


# ---- attention: float64, dim 8, 2 heads (head_dim 4), B 2, T 5; sample 1 left-padded by 2 ----
torch.manual_seed(0)
dim, heads, B, T = 8, 2, 2, 5
ap = {n: leaf(torch.randn(dim, dim, dtype=torch.float64) / math.sqrt(dim)) for n in ["wq.weight", "wk.weight", "wv.weight", "wo.weight"]}
x = leaf(torch.randn(B, T, dim, dtype=torch.float64))
mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.int64)
y = attention(x, ap, "", heads, mask)
dy = torch.randn_like(y)
y.backward(dy)
x_nomask = x.detach()
y_nomask = attention(x_nomask, {k: v.detach() for k, v in ap.items()}, "", heads, None)
save("attention", x=x, mask=mask, y=y, dy=dy, dx=x.grad, y_nomask=y_nomask,
     **{"p." + n: t for n, t in ap.items()}, **{"g." + n: t.grad for n, t in ap.items()})

def llama_shapes(cfg):
    # Parameter name -> shape, in dpe's registration order (layers/llama.h).
    V, D, Hd = cfg["vocab"], cfg["dim"], cfg["hidden"]
    KVD = cfg.get("num_kv_heads", cfg["num_heads"]) * (D // cfg["num_heads"])
    shapes = {"tok_embeddings.weight": (V, D)}
    for i in range(cfg["num_layers"]):
        pre = f"layers.{i}."
        shapes[pre + "attention_norm.weight"] = (D,)
        for n in ["wq", "wk", "wv", "wo"]:
            shapes[pre + f"attention.{n}.weight"] = (KVD, D) if n in ("wk", "wv") else (D, D)
        shapes[pre + "ffn_norm.weight"] = (D,)
        shapes[pre + "feed_forward.w1.weight"] = (Hd, D)
        shapes[pre + "feed_forward.w2.weight"] = (D, Hd)
        shapes[pre + "feed_forward.w3.weight"] = (Hd, D)
    shapes["norm.weight"] = (D,)
    shapes["output.weight"] = (V, D)
    return shapes


def llama_params(shapes):
    # float32 weights drawn from the global generator, in the order of `shapes`.
    params32 = {}
    for n, s in shapes.items():
        if n.endswith("norm.weight"):
            params32[n] = 1.0 + 0.1 * torch.randn(s)  # RMSNorm gains near 1, not all equal
        elif n == "tok_embeddings.weight":
            params32[n] = torch.randn(s)
        else:
            params32[n] = torch.randn(s) / math.sqrt(s[1])
    return params32


# ---- tiny Llama: weights float32; run in float64 (tight check) and float32 ----
torch.manual_seed(1)
cfg = dict(vocab=16, dim=16, num_layers=2, num_heads=2, hidden=24, eps=1e-6)
V = cfg["vocab"]
params32 = llama_params(llama_shapes(cfg))
tokens = torch.randint(0, V, (2, 6))
lmask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]], dtype=torch.int64)
dlogits = torch.randn(2, 6, V)

out = {"tokens": tokens, "mask": lmask, "dlogits": dlogits}
for tag, dtype in [("f64", torch.float64), ("f32", torch.float32)]:
    p = {n: leaf(t.to(dtype)) for n, t in params32.items()}
    logits = llama(tokens, p, cfg, lmask)
    logits.backward(dlogits.to(dtype))
    out[f"logits_{tag}"] = logits
    for n, t in p.items():
        out[f"g_{tag}.{n}"] = t.grad
    with torch.no_grad():
        out[f"logits_nomask_{tag}"] = llama(tokens, p, cfg, None)
for n, t in params32.items():
    out["p." + n] = t
save("llama", **out)

# ---- grouped-query Llama: dim 32, 4 query heads sharing 2 key/value heads (groups of 2), 2 layers; weights
# float32, run in float64; sample 1 left-padded by 2. The next-token loss (cross-entropy, padding targets
# ignored) is differentiated, so its value and every parameter gradient are checked. float32 runs in dpe are
# compared with these float64 values. ----
torch.manual_seed(2)
gcfg = dict(vocab=16, dim=32, num_layers=2, num_heads=4, num_kv_heads=2, hidden=40, eps=1e-6)
V = gcfg["vocab"]
gparams32 = llama_params(llama_shapes(gcfg))
B, T = 2, 7
gtokens = torch.randint(0, V, (B, T + 1))
gmask = torch.tensor([[1] * T, [0, 0] + [1] * (T - 2)], dtype=torch.int64)
inputs, targets = gtokens[:, :T].contiguous(), gtokens[:, 1:].clone()
targets[gmask == 0] = -100  # no loss where the input is padding
p = {n: leaf(t.to(torch.float64)) for n, t in gparams32.items()}
logits = llama(inputs, p, gcfg, gmask)
loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)
loss.backward()
gout = {"tokens": inputs, "mask": gmask, "targets": targets, "logits_f64": logits, "loss_f64": loss}
for n, t in p.items():
    gout[f"g_f64.{n}"] = t.grad
with torch.no_grad():
    gout["logits_nomask_f64"] = llama(inputs, p, gcfg, None)
for n, t in gparams32.items():
    gout["p." + n] = t
save("llama_gqa", **gout)
