#!/usr/bin/python3
"""PyTorch side of dpe's DP-vs-DDP benchmark (`dpe bench --compare-pytorch` runs it).

Trains dpe's built-in models (models/models.h: the same layers in the same order) with PyTorch on the first
--samples Fashion-MNIST training images (tiny-llama: the first --samples records of the fortunes corpus, made
into token rows as data/text_corpus.h does; llama: a preset of layers/llama.h on --samples rows of random
tokens, as `dpe bench --model llama`) and prints one JSON object per configuration on stdout:

  {"framework": "pytorch", "torch": "1.13.0a0", "config": "ddp-gloo", "model": "mlp", "batch": 256,
   "steps": 30, "step_ms": 12.3, "samples_per_s": 20813.0, "processes": 2, "threads_per_process": 1,
   "final_loss": 0.61}

llama rows add "llama_preset", "seq_len", "vocab" and "tokens_per_s" (samples_per_s * seq_len; dpe computes
its own from samples_per_s). CPU rows (single-*, ddp-gloo*) add "peak_rss_bytes": the peak resident set of each
of the configuration's processes while it ran (by rank), which stands for a device's memory there; CUDA rows
(cuda*) add "peak_cuda_bytes", torch.cuda.max_memory_allocated() over the run. A configuration that cannot run
here prints "skipped": "<why>" in place of the numbers (step_ms and samples_per_s are null). Everything else (progress, warnings) goes to stderr. Exit
status: 0 on success, 2 when the data files are missing, 3 when torch cannot be imported, 1 on bad arguments
or a failed run.

Configurations (--configs, comma-separated):
  single-Nt  one process, torch.set_num_threads(N) (and OpenBLAS's threads, see set_threads), a plain
             step on the whole global batch;
             "single" alone uses --threads threads.
  cuda       one process on cuda:0, PyTorch eager at its fastest for these models in float32: cuDNN's
             autotuner on (torch.backends.cudnn.benchmark), TF32 off for matrix products and convolutions
             (dpe's float32 runs float32 FMA math), the samples in pinned host memory and each batch copied
             to the GPU asynchronously (`dpe bench` keeps its data on the host too); skipped without CUDA.
  cuda-bf16  cuda with the forward and the loss under torch.autocast("cuda", dtype=torch.bfloat16) (what
             `dpe bench --precision bf16` runs: the matrix products in bfloat16) and, for llama, AdamW's fused
             CUDA step (fused=True, torch 2.0 and later); skipped without CUDA or bfloat16.
  cuda-bf16-compile
             cuda-bf16 with the model wrapped in torch.compile (PyTorch 2's fastest single-GPU training, its
             compilation in the warm-up steps); skipped where torch has no torch.compile.
  dp         nn.DataParallel over every CUDA device; it needs CUDA, so on CPU the row is skipped.
  ddp-gloo   DistributedDataParallel, gloo backend, 2 processes (torch.multiprocessing.spawn, file://
             rendezvous, so no network is needed), each with max(1, --threads // 2) threads (1 by default).
             Each process takes global_batch / 2 samples of every global batch, strided like
             DistributedSampler (rank r: samples r, r + 2, ...; an odd batch is padded from its start);
             synchronous steps, timed on rank 0 between barriers after the warm-up.
  ddp-gloo-no-sync
             ddp-gloo with every forward and backward inside model.no_sync() and every process stepping on
             its own gradients: nothing exchanged, the bound ddp-gloo's exchanges are measured against (as
             `dpe bench --modes ddp-no-sync` is dpe's); it trains nothing useful.

--channels-last: every configuration with the model converted by model.to(memory_format=torch.channels_last)
and each batch of images by .contiguous(memory_format=torch.channels_last) (rows single-2t-cl, ...). `dpe bench
--channels-last` does not pass it: Debian's PyTorch 1.13 trains the CNN slower that way on these CPUs (3313 ->
2571 samples/s, single-2t), and the comparison is against PyTorch's best configuration.

Each configuration: torch.manual_seed(1), the model, cross_entropy (tiny-llama: over every position, PAD
targets ignored; llama: over every position), SGD(lr=0.01, momentum=0.9) (llama: dpe bench's AdamW,
make_optimizer); --warmup untimed steps, then --steps timed ones (zero_grad, forward, loss, backward, step).
step_ms is the mean time per timed step, samples_per_s = batch * steps / seconds; final_loss is the last
step's loss (for ddp-gloo, the mean over the processes, which is the loss of the whole global batch).

llama (tiny-llama is its tiny preset) is written here with torch's fastest eager attention:
F.scaled_dot_product_attention with is_causal=True where torch has it (2.0 and later: flash or
memory-efficient kernels on a GPU), else softmax(q k^T / sqrt(head_dim) + causal mask) v, which is the best
Debian's torch 1.13 has (it has no fused attention). Grouped-query presets repeat k and v to every query head
(HF's repeat_kv), as dpe does. dpe's model, like this one, sees no padding mask in `dpe bench` (a causal mask
only).

Global batch s covers samples [start, start + batch) with start = s * batch % (samples - batch + 1), the
rule `dpe bench` uses (tools/dpe/bench_command.cc), so both iterate over the same data in the same order.

  /usr/bin/python3 tools/bench/pytorch_reference.py --model mlp --batch 256 --steps 30 --warmup 5 \\
      --configs single-1t,single-2t,ddp-gloo --threads 2
  /usr/bin/python3 tools/bench/pytorch_reference.py --model cnn --print-params   # {"model": ..., "params": ...}
  /usr/bin/python3 tools/bench/pytorch_reference.py --model llama --llama-preset small --seq-len 128 --batch 4 \\
      --steps 2 --warmup 1 --samples 12

Threads: each configuration limits OpenBLAS's threads as well as torch's (set_threads), and the script sets
OMP_WAIT_POLICY=PASSIVE unless the environment sets it (see main): both matter with Debian's torch, whose
matrix products go to OpenBLAS's own thread pool rather than torch's OpenMP one.

Needs Debian's python3-torch (1.13, CPU) and python3-numpy: apt-get install python3-torch; on a GPU machine, any
python3 whose torch has CUDA (`dpe bench --pytorch-python`).
"""

import argparse
import contextlib
import gzip
import json
import math
import os
import shutil
import struct
import sys
import tempfile
import time

DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"
FORTUNES_PATH = "/usr/share/games/fortunes/fortunes"  # data/text_corpus.h's kFortunesPath
BOS, EOS, PAD, VOCAB = 256, 257, 258, 259  # data/text_corpus.h
# layers/llama.cc's llama_preset, field for field: keep the two tables in step. kv_heads 0 means num_heads
# (multi-head attention); init_std None means each layer's PyTorch default initialisation.
LLAMA_PRESETS = {
    "tiny": dict(vocab=259, dim=128, num_layers=2, num_heads=4, kv_heads=0, hidden_dim=384, max_seq_len=64,
                 eps=1e-6, theta=10000.0, tie=False, init_std=None),
    "small": dict(vocab=32000, dim=768, num_layers=12, num_heads=12, kv_heads=3, hidden_dim=3072, max_seq_len=512,
                  eps=1e-6, theta=10000.0, tie=False, init_std=0.02),
    "124m": dict(vocab=50304, dim=768, num_layers=12, num_heads=12, kv_heads=12, hidden_dim=3072, max_seq_len=1024,
                 eps=1e-6, theta=10000.0, tie=True, init_std=0.02),
}
# models/models.cc's tiny_llama_config is the tiny preset at vocab 259; its rows are models.h's kTinyLlamaSeqLen.
TINY_LLAMA = LLAMA_PRESETS["tiny"]
MEAN, STD = 0.2860, 0.3530  # data/fashion_mnist.h
LR, MOMENTUM, SEED = 0.01, 0.9, 1
# --model llama: dpe bench's optimizer for it (tools/dpe/bench_rows.cc): AdamW at lr 6e-4, betas (0.9, 0.999),
# eps 1e-8, the matrices in a group of their own with weight decay 0.1 (the tutorials'), norms' gains in one
# without.
LLAMA_LR, LLAMA_WEIGHT_DECAY = 6e-4, 0.1
DDP_PROCESSES = 2

EXIT_BAD_ARGS, EXIT_NO_DATA, EXIT_NO_TORCH = 1, 2, 3


def log(*args):
    print("pytorch_reference:", *args, file=sys.stderr, flush=True)


def emit(row):
    print(json.dumps(row), flush=True)  # ", " and ": " separators: the C++ parser expects them


# ---------------------------------------------------------------- memory


def reset_peak_rss():
    """Starts this process's peak resident set afresh (Linux: writing 5 to /proc/self/clear_refs resets VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_bytes():
    """This process's peak resident set since reset_peak_rss (VmHWM): PyTorch's CPU tensors have no per-device
    allocator statistics, so the process's memory stands for its device's (with the interpreter and the data)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------- data


def data_paths(data_dir):
    return (os.path.join(data_dir, "train-images-idx3-ubyte.gz"),
            os.path.join(data_dir, "train-labels-idx1-ubyte.gz"))


def read_idx(path, expected_magic, count):
    """The first `count` items of a gzip'd IDX file: (numpy uint8 array of shape (n, *dims), total items)."""
    import numpy as np
    with gzip.open(path, "rb") as f:
        header = f.read(4)
        if len(header) != 4:
            raise ValueError(f"{path}: truncated IDX header")
        zero, dtype, ndim = struct.unpack(">HBB", header)
        if zero != 0 or dtype != 0x08 or (dtype << 8 | ndim) != expected_magic:
            raise ValueError(f"{path}: not an unsigned-byte IDX file of the expected kind "
                             f"(magic 0x{struct.unpack('>I', header)[0]:08x}, expected 0x{expected_magic:08x})")
        dims = struct.unpack(f">{ndim}I", f.read(4 * ndim))
        n = min(count, dims[0])
        item = 1
        for d in dims[1:]:
            item *= d
        raw = f.read(n * item)
        if len(raw) != n * item:
            raise ValueError(f"{path}: truncated data ({len(raw)} of {n * item} bytes)")
    return np.frombuffer(raw, dtype=np.uint8).reshape((n,) + tuple(dims[1:])), dims[0]


def load_fashion_mnist(data_dir, samples):
    """(images (N, 1, 28, 28) float32 normalised, labels (N,) int64) as torch tensors."""
    import numpy as np
    import torch
    images_path, labels_path = data_paths(data_dir)
    images, total_images = read_idx(images_path, 0x0803, samples)
    labels, total_labels = read_idx(labels_path, 0x0801, samples)
    if total_images != total_labels or images.shape[1:] != (28, 28):
        raise ValueError(f"{data_dir}: {total_images} images of shape {images.shape[1:]} but {total_labels} labels")
    x = ((images.astype(np.float32) / np.float32(255.0) - np.float32(MEAN)) / np.float32(STD)).reshape(-1, 1, 28, 28)
    return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(labels.astype(np.int64))


def load_text_corpus(path, records, seq_len):
    """(inputs (N, seq_len), targets (N, seq_len)) int64 from the first `records` records of a fortune(6)
    file, as data/text_corpus.h makes them: records split at "%" lines, one trailing newline dropped, empty
    ones skipped; [BOS] bytes [EOS] [PAD ...] cut or padded to seq_len + 1; targets = inputs shifted by one."""
    import torch
    with open(path, "rb") as f:
        text = f.read()
    rows, current = [], []

    def add(lines):
        record = b"".join(lines)
        record = record[:-2] if record.endswith(b"\r\n") else record[:-1] if record.endswith(b"\n") else record
        if record:
            rows.append(record)

    for line in text.splitlines(keepends=True):
        if line.rstrip(b"\n") in (b"%", b"%\r"):
            add(current)
            current = []
        else:
            current.append(line)
    add(current)
    if not rows:
        raise ValueError(f"{path}: no records")
    rows = rows[:records]
    seqs = torch.full((len(rows), seq_len + 1), PAD, dtype=torch.int64)
    for i, r in enumerate(rows):
        body = list(r[:seq_len]) + [EOS]
        seq = ([BOS] + body)[:seq_len + 1]
        seqs[i, :len(seq)] = torch.tensor(seq, dtype=torch.int64)
    return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


def random_tokens(rows, seq_len, vocab):
    """(inputs (rows, seq_len), targets (rows, seq_len)) int64: rows of seq_len + 1 uniform tokens in
    [0, vocab) from a generator seeded 0, targets = inputs shifted by one, the shape `dpe bench --model llama`
    trains on (tools/dpe/bench_rows.cc's random_tokens; other numbers: a speed, not a learning, measurement)."""
    import torch
    windows = torch.randint(0, vocab, (rows, seq_len + 1), generator=torch.Generator().manual_seed(0))
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def load_data(args):
    """(inputs, targets) of --model: Fashion-MNIST images and labels, tiny-llama's token rows, or llama's
    random ones."""
    if args.model == "llama":
        return random_tokens(args.samples, args.seq_len, args.vocab)
    if args.model == "tiny-llama":
        return load_text_corpus(args.data_dir, args.samples, TINY_LLAMA["max_seq_len"])
    return load_fashion_mnist(args.data_dir, args.samples)


def data_files(args):
    if args.model == "llama":
        return []
    return [args.data_dir] if args.model == "tiny-llama" else list(data_paths(args.data_dir))


# ---------------------------------------------------------------- threads


_blas = None


def set_threads(n):
    """torch.set_num_threads(n), and the same for the BLAS torch calls for matrix products.

    Debian's torch (BLAS_INFO=generic) calls libblas.so.3, by default OpenBLAS's pthread build, whose own
    thread pool uses every core whatever torch.set_num_threads says: "single-1t" would run its matrix
    products on 2 threads, "single-2t" would have torch's OpenMP threads and OpenBLAS's fight over the 2
    cores, and each ddp-gloo process would run 2 BLAS threads. openblas_set_num_threads fixes that.
    """
    global _blas
    import ctypes
    import torch
    torch.set_num_threads(n)
    if _blas is None:
        try:
            lib = ctypes.CDLL("libblas.so.3")  # the library torch loaded (same soname)
            _blas = lib if hasattr(lib, "openblas_set_num_threads") else False
        except OSError:
            _blas = False
        if not _blas:
            log("libblas.so.3 is not OpenBLAS: its threads are not limited (the thread counts may be off)")
    if _blas:
        _blas.openblas_set_num_threads(ctypes.c_int(n))


def batch_start(step, batch, n):
    return step * batch % max(1, n - batch + 1)


def rank_indices(start, batch, rank, world):
    """DistributedSampler's split of the global batch [start, start + batch): padded[rank::world]."""
    idx = list(range(start, start + batch))
    total = math.ceil(batch / world) * world
    idx += idx[:total - batch]
    return idx[rank::world]


# ---------------------------------------------------------------- models


def llama(cfg):
    """layers/llama.h's Llama in torch, for a preset of LLAMA_PRESETS (or one with another vocab): Meta's Llama
    names, registered in dpe's order; token embedding, pre-norm blocks (RMSNorm -> causal self-attention with
    RoPE, HF's rotate_half, on q and k; grouped-query when kv_heads < num_heads, k and v repeated like HF's
    repeat_kv -> RMSNorm -> SwiGLU feed-forward w2(silu(w1 x) * w3 x)), final RMSNorm, output projection (the
    embedding's table itself when cfg["tie"]); no biases. Initialisation as dpe's: with init_std every Linear
    and Embedding weight ~ N(0, init_std), else each layer's PyTorch default; RMSNorm gains 1."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    dim, heads = cfg["dim"], cfg["num_heads"]
    kv_heads = cfg["kv_heads"] or heads
    head_dim = dim // heads
    n_rep = heads // kv_heads
    if dim % heads or head_dim % 2 or heads % kv_heads:
        raise ValueError(f"llama: dim {dim}, num_heads {heads}, kv_heads {kv_heads}: expected dim % num_heads == 0, "
                         f"an even head_dim and num_heads % kv_heads == 0")
    scale = 1.0 / math.sqrt(head_dim)

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["eps"]) * self.weight

    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], dim=-1)

    def repeat_kv(x):
        """HF's repeat_kv: (B, kv_heads, T, hd) -> (B, heads, T, hd), key/value head j serving query heads
        j * n_rep ... j * n_rep + n_rep - 1."""
        if n_rep == 1:
            return x
        B, KV, T, hd = x.shape
        return x[:, :, None].expand(B, KV, n_rep, T, hd).reshape(B, KV * n_rep, T, hd)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = nn.Linear(dim, dim, bias=False)
            self.wk = nn.Linear(dim, kv_heads * head_dim, bias=False)
            self.wv = nn.Linear(dim, kv_heads * head_dim, bias=False)
            self.wo = nn.Linear(dim, dim, bias=False)

        def forward(self, x, cos, sin, causal):
            B, T, _ = x.shape
            q = self.wq(x).view(B, T, heads, head_dim).transpose(1, 2)
            k = self.wk(x).view(B, T, kv_heads, head_dim).transpose(1, 2)
            v = self.wv(x).view(B, T, kv_heads, head_dim).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k, v = repeat_kv(k), repeat_kv(v)
            if hasattr(F, "scaled_dot_product_attention"):
                # torch 2.0 and later: its fused kernels (flash or memory-efficient on a GPU).
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                # torch 1.13 (Debian's) has no fused attention: softmax(q k^T / sqrt(hd) + causal mask) v in
                # eager ops is the fastest form it has.
                scores = (q @ k.transpose(-2, -1)) * scale
                out = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1) @ v
            return self.wo(out.transpose(1, 2).reshape(B, T, dim))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(dim, cfg["hidden_dim"], bias=False)
            self.w2 = nn.Linear(cfg["hidden_dim"], dim, bias=False)
            self.w3 = nn.Linear(dim, cfg["hidden_dim"], bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.attention = RMSNorm(), Attention()
            self.ffn_norm, self.feed_forward = RMSNorm(), FeedForward()

        def forward(self, h, cos, sin, causal):
            h = h + self.attention(self.attention_norm(h), cos, sin, causal)
            return h + self.feed_forward(self.ffn_norm(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(cfg["vocab"], dim)
            self.layers = nn.ModuleList(Block() for _ in range(cfg["num_layers"]))
            self.norm = RMSNorm()
            # Tied: forward multiplies by tok_embeddings.weight, one parameter receiving both uses' gradients.
            self.output = None if cfg["tie"] else nn.Linear(dim, cfg["vocab"], bias=False)
            if cfg["init_std"] is not None:
                std = cfg["init_std"]
                nn.init.normal_(self.tok_embeddings.weight, 0.0, std)
                for b in self.layers:
                    for layer in (b.attention.wq, b.attention.wk, b.attention.wv, b.attention.wo,
                                  b.feed_forward.w1, b.feed_forward.w2, b.feed_forward.w3):
                        nn.init.normal_(layer.weight, 0.0, std)
                if self.output is not None:
                    nn.init.normal_(self.output.weight, 0.0, std)
            # RoPE tables in double, cast to float32 (as functional::rotary_tables), made once and sliced to each
            # batch's length: constants, which DDP need not broadcast (ddp_worker).
            T = cfg["max_seq_len"]
            inv_freq = 1.0 / (cfg["theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
            emb = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq).repeat(1, 2)
            self.register_buffer("cos", emb.cos().float(), persistent=False)
            self.register_buffer("sin", emb.sin().float(), persistent=False)

        def forward(self, tokens):
            T = tokens.shape[1]
            if T > cfg["max_seq_len"]:
                raise ValueError(f"llama: sequence length {T} exceeds max_seq_len {cfg['max_seq_len']}")
            cos, sin = self.cos[:T], self.sin[:T]
            causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).triu(1)  # True: a future key, masked
            h = self.tok_embeddings(tokens)
            for block in self.layers:
                h = block(h, cos, sin, causal)
            h = self.norm(h)
            return self.output(h) if self.output is not None else F.linear(h, self.tok_embeddings.weight)

    return Llama()


def llama_config(args):
    """--model llama's configuration: --llama-preset with --vocab (0: the preset's own)."""
    cfg = dict(LLAMA_PRESETS[args.llama_preset])
    if args.vocab:
        cfg["vocab"] = args.vocab
    return cfg


def loss_fn(args):
    """The model's loss: (output, targets) -> scalar. Language models: cross_entropy over (B * T, V)."""
    import torch.nn.functional as F
    if args.model == "tiny-llama":
        return lambda logits, targets: F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=PAD)
    if args.model == "llama":
        return lambda logits, targets: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return F.cross_entropy


_logged_params = False


def make_model(args):
    """--model's module (the first one built in a process logs its parameter count)."""
    global _logged_params
    model = build_model(args)
    if not _logged_params:
        log(f"{args.model}: {parameter_count(model)} parameters")
        _logged_params = True
    return model


def build_model(args):
    from torch import nn
    name = args.model
    if name == "llama":
        return llama(llama_config(args))
    if name == "tiny-llama":
        return llama(TINY_LLAMA)
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 10))
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    raise ValueError(f"unknown model {name!r}")


def make_optimizer(args, model, fused=False):
    """dpe bench's optimizer for --model: SGD with momentum, or llama's AdamW (LLAMA_LR). AdamW's default
    per-tensor loop, not foreach=True: on torch 1.13's CPU the foreach form was no faster (the small preset's
    step 474 ms against 611-733 ms on one thread). fused: AdamW's fused CUDA kernel (torch 2.0 and later)."""
    import torch
    if args.model != "llama":
        return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    params = list(model.parameters())
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": LLAMA_WEIGHT_DECAY},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=LLAMA_LR,
                             **({"fused": True} if fused else {}))


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- configurations


def base_row(args, config):
    import torch
    row = {"framework": "pytorch", "torch": torch.__version__, "config": config + ("-cl" if args.channels_last else ""),
           "model": args.model, "batch": args.batch, "steps": args.steps}
    if args.model == "llama":
        row.update({"llama_preset": args.llama_preset, "seq_len": args.seq_len, "vocab": args.vocab})
    return row


def in_memory_format(args, model):
    """--channels-last: PyTorch's recipe, the model's 4-d parameters in channels-last memory (its convolutions
    then return channels-last outputs), and each batch of images converted (as_input)."""
    import torch
    return model.to(memory_format=torch.channels_last) if args.channels_last else model


def as_input(args, x):
    import torch
    return x.contiguous(memory_format=torch.channels_last) if args.channels_last and x.dim() == 4 else x


def timed_row(args, config, seconds, processes, threads, final_loss):
    row = base_row(args, config)
    row.update({"step_ms": seconds * 1e3 / args.steps, "samples_per_s": args.batch * args.steps / seconds,
                "processes": processes, "threads_per_process": threads, "final_loss": final_loss})
    if args.model == "llama":
        row["tokens_per_s"] = row["samples_per_s"] * args.seq_len
    return row


def train_loop(args, model, optimizer, batch_fn, sync=None, before_timing=None, step_context=contextlib.nullcontext,
               forward_context=contextlib.nullcontext):
    """Warm-up, then timed steps; returns (seconds, last loss tensor). batch_fn(step) -> (x, y); each step's
    forward and backward run inside step_context() (DDP's no_sync for ddp-gloo-no-sync), its forward and loss
    alone inside forward_context() (autocast, which PyTorch advises against for the backward)."""
    loss, criterion = None, loss_fn(args)

    def step(s):
        nonlocal loss
        x, y = batch_fn(s)
        optimizer.zero_grad()
        with step_context():
            with forward_context():
                loss = criterion(model(x), y)
            loss.backward()
        optimizer.step()

    for s in range(args.warmup):
        step(s)
    if before_timing:
        before_timing()
    if sync:
        sync()
    start = time.perf_counter()
    for s in range(args.steps):
        step(args.warmup + s)
    if sync:
        sync()
    return time.perf_counter() - start, loss.detach()


def run_single(args, config, threads, data):
    import torch
    set_threads(threads)
    torch.manual_seed(SEED)
    images, labels = data
    model = in_memory_format(args, make_model(args))
    optimizer = make_optimizer(args, model)
    n = images.shape[0]

    def batch_fn(s):
        start = batch_start(s, args.batch, n)
        return as_input(args, images[start:start + args.batch]), labels[start:start + args.batch]

    seconds, loss = train_loop(args, model, optimizer, batch_fn)
    return timed_row(args, config, seconds, 1, threads, loss.item())


def skipped_row(args, config, why):
    import torch
    row = base_row(args, config)
    row.update({"skipped": why, "step_ms": None, "samples_per_s": None, "processes": 1,
                "threads_per_process": torch.get_num_threads()})
    return row


def run_cuda(args, data, config="cuda"):
    import torch
    bf16 = config in ("cuda-bf16", "cuda-bf16-compile")
    compiled = config == "cuda-bf16-compile"
    if not torch.cuda.is_available():
        return skipped_row(args, config, "no CUDA device for this torch")
    if bf16 and not torch.cuda.is_bf16_supported():
        return skipped_row(args, config, f"{torch.cuda.get_device_name(0)} has no bfloat16")
    if compiled and not hasattr(torch, "compile"):
        return skipped_row(args, config, f"torch.compile needs torch 2.0 or later (this is {torch.__version__})")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(SEED)
    images, labels = (t.pin_memory() for t in data)
    model = in_memory_format(args, make_model(args).cuda())
    optimizer = make_optimizer(args, model, fused=bf16 and hasattr(torch, "compile"))
    if compiled:
        model = torch.compile(model)
    n = images.shape[0]

    def batch_fn(s):
        start = batch_start(s, args.batch, n)
        return (as_input(args, images[start:start + args.batch].cuda(non_blocking=True)),
                labels[start:start + args.batch].cuda(non_blocking=True))

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    torch.cuda.reset_peak_memory_stats()
    try:
        seconds, loss = train_loop(args, model, optimizer, batch_fn, sync=torch.cuda.synchronize,
                                   forward_context=autocast)
    except Exception as e:  # noqa: BLE001: a compiler that cannot build here (no triton, no C compiler) skips the row
        if not compiled:
            raise
        return skipped_row(args, config, f"torch.compile failed: {type(e).__name__}: {str(e)[:300]}")
    return timed_row(args, config, seconds, 1, torch.get_num_threads(), loss.item()) | {
        "device": torch.cuda.get_device_name(0), "peak_cuda_bytes": torch.cuda.max_memory_allocated()}


def run_dp(args, data):
    import torch
    if not torch.cuda.is_available():
        return skipped_row(args, "dp", "nn.DataParallel needs CUDA devices")
    # Not exercised on the CPU-only machines this project runs on (Debian's torch has no CUDA).
    torch.manual_seed(SEED)
    images, labels = data
    model = torch.nn.DataParallel(in_memory_format(args, make_model(args).cuda()))
    optimizer = make_optimizer(args, model)
    n = images.shape[0]

    def batch_fn(s):
        start = batch_start(s, args.batch, n)
        return as_input(args, images[start:start + args.batch]), labels[start:start + args.batch].cuda()

    seconds, loss = train_loop(args, model, optimizer, batch_fn, sync=torch.cuda.synchronize)
    return timed_row(args, "dp", seconds, 1, torch.get_num_threads(), loss.item()) | {
        "devices": torch.cuda.device_count()}


def ddp_worker(rank, world, init_file, args, threads, queue, config):
    import torch
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only: no network needed
    set_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        images, labels = load_data(args)
        torch.manual_seed(SEED)
        # The language models' buffers are constant RoPE tables: not broadcast before every forward, as the
        # default would (the CNN's BatchNorm statistics are, as its default).
        model = torch.nn.parallel.DistributedDataParallel(in_memory_format(args, make_model(args)),
                                                          broadcast_buffers=args.model not in ("llama", "tiny-llama"))
        optimizer = make_optimizer(args, model)
        n = images.shape[0]
        # Index tensors per distinct batch start, made once: the split is not part of the timed step.
        index_cache = {}

        def batch_fn(s):
            start = batch_start(s, args.batch, n)
            idx = index_cache.get(start)
            if idx is None:
                idx = index_cache[start] = torch.tensor(rank_indices(start, args.batch, rank, world))
            return as_input(args, images.index_select(0, idx)), labels.index_select(0, idx)

        no_sync = model.no_sync if config == "ddp-gloo-no-sync" else contextlib.nullcontext
        seconds, loss = train_loop(args, model, optimizer, batch_fn, sync=dist.barrier, step_context=no_sync)
        dist.all_reduce(loss)  # after the timing: the mean of the ranks' losses
        # Each rank's peak through the queue, not another collective (a gloo all_gather here hung now and then).
        queue.put(("peak_rss_bytes", rank, peak_rss_bytes()))
        if rank == 0:
            queue.put(timed_row(args, config, seconds, world, threads, loss.item() / world))
    finally:
        dist.destroy_process_group()


def run_ddp_gloo(args, config):
    import torch.multiprocessing as mp
    threads = max(1, args.threads // DDP_PROCESSES)
    tmp = tempfile.mkdtemp(prefix="dpe_pytorch_ddp_")
    try:
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(ddp_worker, args=(DDP_PROCESSES, os.path.join(tmp, "rendezvous"), args, threads, queue, config),
                 nprocs=DDP_PROCESSES, join=True)
        row, rss = None, {}
        while not queue.empty():
            item = queue.get()
            if isinstance(item, tuple):
                rss[item[1]] = item[2]
            else:
                row = item
        if row is None:
            raise RuntimeError(f"{config}: rank 0 reported no result")
        row["peak_rss_bytes"] = [rss[r] for r in sorted(rss)]  # each rank's process, by rank
        return row
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- main


class Parser(argparse.ArgumentParser):
    def error(self, message):  # exit 1, so that 2 means "data files missing" only
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_ARGS, f"{self.prog}: error: {message}\n")


# The configurations besides single and single-Nt (the module docstring says what each runs; dpe bench's
# kPytorchNamedConfigs, tools/dpe/bench.h, lists the same).
NAMED_CONFIGS = ("cuda", "cuda-bf16", "cuda-bf16-compile", "dp", "ddp-gloo", "ddp-gloo-no-sync")
CONFIG_LIST = ", ".join(("single", "single-Nt") + NAMED_CONFIGS)


def parse_config(name, threads):
    if name == "single":
        return ("single", threads)
    if name.startswith("single-") and name.endswith("t") and name[7:-1].isdigit() and int(name[7:-1]) > 0:
        return ("single", int(name[7:-1]))
    if name in NAMED_CONFIGS:
        return (name, None)
    raise ValueError(f"unknown config {name!r} (known: {CONFIG_LIST})")


def main(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0], epilog="See the module docstring for the output format.")
    p.add_argument("--model", choices=["mlp", "cnn", "tiny-llama", "llama"], default="mlp")
    p.add_argument("--llama-preset", choices=list(LLAMA_PRESETS), default="124m",
                   help="--model llama: the preset (LLAMA_PRESETS, layers/llama.cc's; default 124m)")
    p.add_argument("--seq-len", type=int, default=0,
                   help="--model llama: tokens per row (default 0: the preset's max_seq_len)")
    p.add_argument("--vocab", type=int, default=0,
                   help="--model llama: the vocabulary (default 0: the preset's own)")
    p.add_argument("--batch", type=int, default=256, help="global batch size (default 256)")
    p.add_argument("--channels-last", action="store_true",
                   help="model and images in channels-last memory (torch.channels_last; rows ...-cl)")
    p.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them (default 5)")
    p.add_argument("--configs", default="single-1t,single-2t,ddp-gloo",
                   help=f"comma-separated: {CONFIG_LIST} (default single-1t,single-2t,ddp-gloo)")
    p.add_argument("--threads", type=int, default=2,
                   help="cores to use: threads of 'single'; ddp-gloo's 2 processes get threads // 2 each (default 2)")
    p.add_argument("--samples", type=int, default=8192,
                   help="first N training images or records; llama: N rows of random tokens (default 8192)")
    p.add_argument("--data-dir", help=f"Fashion-MNIST directory (default {DEFAULT_DATA_DIR}), or tiny-llama's "
                   f"text file (default {FORTUNES_PATH})")
    p.add_argument("--print-params", action="store_true",
                   help="print {\"model\": ..., \"params\": N} for --model and exit (no data needed)")
    args = p.parse_args(argv)
    if args.model == "llama":
        # Resolved here, so that the model, the data and the rows all see the same numbers.
        preset = LLAMA_PRESETS[args.llama_preset]
        if args.vocab < 0 or not 0 <= args.seq_len <= preset["max_seq_len"]:
            p.error(f"--vocab {args.vocab} must be >= 0 and --seq-len {args.seq_len} in [0, "
                    f"{preset['max_seq_len']}] (the {args.llama_preset} preset's max_seq_len)")
        args.vocab = args.vocab or preset["vocab"]
        args.seq_len = args.seq_len or preset["max_seq_len"]
    if args.data_dir is None:
        args.data_dir = FORTUNES_PATH if args.model == "tiny-llama" else DEFAULT_DATA_DIR

    # Before torch loads libgomp (it reads this once): idle OpenMP threads sleep instead of spinning, which
    # otherwise take the cores from OpenBLAS's own threads (set_threads): on the 2-core VMs single-2t ran
    # 2-3x slower than single-1t with the default spinning. OMP_WAIT_POLICY=ACTIVE in the environment wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import numpy  # noqa: F401
        import torch
    except ImportError as e:
        print(f"pytorch_reference: cannot import {e.name}: install Debian's python3-torch "
              f"(apt-get install python3-torch) and run with /usr/bin/python3", file=sys.stderr)
        return EXIT_NO_TORCH

    if args.print_params:
        model = build_model(args)
        info = {"llama_preset": args.llama_preset, "vocab": args.vocab} if args.model == "llama" else {}
        emit({"model": args.model, **info, "params": parameter_count(model),
              "layers": [{"name": n, "shape": list(t.shape), "numel": t.numel()} for n, t in model.named_parameters()]})
        return 0

    for name in ("batch", "steps", "threads", "samples"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must be at least 0")
    try:
        configs = [(c, parse_config(c, args.threads)) for c in args.configs.split(",") if c]
    except ValueError as e:
        p.error(str(e))
    if not configs:
        p.error("--configs is empty")

    missing = [f for f in data_files(args) if not os.path.isfile(f)]
    if missing:
        print(f"pytorch_reference: data files missing: {', '.join(missing)}\n"
              f"  install them (apt-get install dataset-fashion-mnist fortunes-min) or point --data-dir at a "
              f"directory with train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz (tiny-llama: a text file)",
              file=sys.stderr)
        return EXIT_NO_DATA
    try:
        data = load_data(args)
    except (OSError, ValueError) as e:
        print(f"pytorch_reference: cannot read the data: {e}", file=sys.stderr)
        return EXIT_NO_DATA
    if data[0].shape[0] < args.batch:
        p.error(f"--batch {args.batch} is larger than the {data[0].shape[0]} samples loaded")
    if args.samples > data[0].shape[0]:
        log(f"only {data[0].shape[0]} training samples, not {args.samples}")
        args.samples = data[0].shape[0]

    log(f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    model = args.model
    if args.model == "llama":
        model = f"llama {args.llama_preset} (vocab {args.vocab}, seq_len {args.seq_len})"
    log(f"torch {torch.__version__}, model {model}, global batch {args.batch}, {args.warmup} warm-up + "
        f"{args.steps} timed steps, {args.samples} samples")
    for name, (kind, threads) in configs:
        log(f"running {name}")
        if kind == "single":
            reset_peak_rss()
            row = run_single(args, name, threads, data)
            row["peak_rss_bytes"] = [peak_rss_bytes()]
        elif kind.startswith("cuda"):
            row = run_cuda(args, data, kind)
        elif kind == "dp":
            row = run_dp(args, data)
        else:
            row = run_ddp_gloo(args, kind)
        emit(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
