"""Writes golden fixtures that dpe's C++ tests read with tests/testing/golden.h.

Format of a .golden file (little-endian):
    dpe-golden 1\n
    <name> <dtype> <dim0>,<dim1>,...\n      one line per tensor; dtype in float32, float64, int64;
                                            a 0-dim tensor has the shape word "-"
    end\n
    <raw data of every tensor, in the order of the lines above, row-major>

Run the generators with Debian's PyTorch: /usr/bin/python3 tests/golden/gen_<area>.py. CI never runs them:
the fixtures are committed, small (keep each file under ~200 KB).
"""
import pathlib

import torch

DATA_DIR = pathlib.Path(__file__).resolve().parent / "data"

_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64"}


def save(name: str, **tensors: torch.Tensor) -> None:
    """Writes tests/golden/data/<name>.golden with the given tensors (detached, contiguous, on CPU)."""
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    header = ["dpe-golden 1"]
    blobs = []
    for key, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}.{key}: dtype {t.dtype} not supported")
        shape = ",".join(str(d) for d in t.shape) if t.dim() > 0 else "-"
        header.append(f"{key} {_DTYPES[t.dtype]} {shape}")
        blobs.append(t.numpy().tobytes())
    header.append("end")
    with open(DATA_DIR / f"{name}.golden", "wb") as f:
        f.write(("\n".join(header) + "\n").encode())
        for b in blobs:
            f.write(b)
