"""A safetensors file written outside dpe, for io/checkpoint_test.cc (dpe must read it).

Writes io/testdata/torch_mlp.safetensors: the state_dict of a PyTorch MLP (fc1: Linear(4, 3),
fc2: Linear(3, 2), float32), with the Python `safetensors` package when it is installed, else byte by byte
with json + struct exactly as the format specifies (8-byte little-endian header length, JSON header, data).
Also writes tests/golden/data/checkpoint_torch.golden with the same tensors, to compare against.
"""
import json
import pathlib
import struct

import torch

from golden_io import save

OUT = pathlib.Path(__file__).resolve().parents[2] / "engine" / "testdata" / "torch_mlp.safetensors"


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 3)
        self.fc2 = torch.nn.Linear(3, 2)


torch.manual_seed(0)
model = Mlp()
state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
OUT.parent.mkdir(parents=True, exist_ok=True)
try:
    from safetensors.torch import save_file

    save_file(state, str(OUT), metadata={"format": "pt"})
    print("written with the safetensors package")
except ImportError:
    # The package's layout: tensors sorted by name (its own order is by dtype alignment, then name; all
    # float32 here), data back to back, header padded with spaces to a multiple of 8 bytes.
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name in sorted(state):
        data = state[name].numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(state[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(OUT, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    print("written by hand (no safetensors package)")
save("checkpoint_torch", **{k.replace(".", "_"): v for k, v in state.items()})
