"""Runs every bad input of tools/reliability/bad_inputs.txt through the dpe tool and checks the promise of
docs/RELIABILITY.md: the expected exit code, a message naming the problem, no crash, no hang.

Usage: bad_inputs.py DPE_BINARY CASES_FILE [--markdown docs/RELIABILITY.md] [--only SUBSTRING]

Each case line is `class | exit code | message substring | arguments`; the arguments are split like a
shell would split them (shlex), but no shell runs: the program gets them as an argument vector. {tmp} and the
fixture names below are replaced by paths this script prepares in a fresh temporary directory. A case passes
when the exit code is the expected one, the combined output contains the substring, and the command ends
within the time limit. Prints one line per failure and ends with "N passed, N failed"; exits 1 when anything
failed. With --markdown it rewrites the table between the markers in that file from what it observed.
"""
import argparse
import gzip
import json
import os
import pathlib
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

FASHION_MNIST = pathlib.Path("/usr/share/datasets/fashion-mnist")
TIME_LIMIT_S = 120  # far above any case's run time: reaching it is a hang
BEGIN, END = "<!-- bad-inputs:begin -->", "<!-- bad-inputs:end -->"


def run(argv, env, timeout=TIME_LIMIT_S):
    start = time.monotonic()
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           env=env, timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace"), time.monotonic() - start
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace")
        return None, out, time.monotonic() - start


def rewrite_checkpoint(src, dst, mutate):
    """Copies a safetensors checkpoint with its JSON header changed by mutate(header) (the data unchanged)."""
    blob = src.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    mutate(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    dst.write_bytes(struct.pack("<Q", len(text)) + text + blob[8 + n:])


def overlap_second_tensor(header):
    """The second tensor in the data section made to start where the first does (aliased bytes)."""
    tensors = sorted((v for k, v in header.items() if k != "__metadata__"), key=lambda t: t["data_offsets"][0])
    first, second = tensors[0], tensors[1]
    size = second["data_offsets"][1] - second["data_offsets"][0]
    second["data_offsets"] = [first["data_offsets"][0], first["data_offsets"][0] + size]


def first_tensor(header):
    return header[next(k for k in header if k != "__metadata__")]


def idx_bytes(magic_type, dims, payload):
    return bytes([0, 0, magic_type, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


def gzipped_idx(magic_type, dims, payload):
    return gzip.compress(idx_bytes(magic_type, dims, payload))


def gzip_with_zeros(data, zeros):
    """`data` then `zeros` zero bytes, gzipped a MiB at a time (a small file that decompresses to a lot)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(data)]
    chunk = bytes(1 << 20)
    for _ in range(zeros // len(chunk)):
        out.append(z.compress(chunk))
    out.append(z.flush())
    return b"".join(out)


def prepare(tmp, dpe, env):
    """The fixtures the cases name: returns {name: path}."""
    f = {"tmp": tmp}
    (tmp / "adir").mkdir()
    f["adir"] = tmp / "adir"
    f["missing"] = tmp / "no" / "such" / "dir"
    f["empty"] = tmp / "empty"
    f["empty"].write_bytes(b"")
    f["garbage"] = tmp / "garbage"
    f["garbage"].write_bytes(bytes((i * 131 + 7) % 256 for i in range(4096)))
    f["fifo"] = tmp / "fifo"
    os.mkfifo(f["fifo"])
    f["dangling"] = tmp / "dangling"
    os.symlink(tmp / "nothing", f["dangling"])
    # Helper programs that never finish, or never stop writing (in place of python3).
    for name, script in {"sleeper": "#!/bin/sh\nexec sleep 600\n", "flood": "#!/bin/sh\nexec yes\n"}.items():
        f[name] = tmp / name
        f[name].write_text(script)
        f[name].chmod(0o755)
    # A valid checkpoint of the mlp after one epoch, and variants of it.
    ck = tmp / "ck.safetensors"
    code, out, _ = run([dpe, "train", "--model", "mlp", "--mode", "single", "--epochs", "1", "--limit", "64",
                        "--batch-size", "32", "--save-every", "1", "--checkpoint", str(ck)], env)
    if code != 0:
        sys.exit(f"fixture: dpe train could not write a checkpoint (exit {code}):\n{out}")
    f["ck"] = ck
    for name, changes in {
        "ck_epoch_negative": {"training.epoch": "-4"},
        "ck_epoch_huge": {"training.epoch": "9223372036854775807"},
        "ck_epoch_text": {"training.epoch": "one"},
        "ck_step_negative": {"training.step": "-1"},
        "ck_rng_garbled": {"training.rng.cpu:0": "12;34"},
        "ck_version": {"dpe.checkpoint_version": "99"},
        "ck_lr_nan": {"optimizer.param_groups.0.lr": "nan"},
        "ck_momentum_negative": {"optimizer.param_groups.0.momentum": "-0.9"},
    }.items():
        f[name] = tmp / f"{name}.safetensors"
        rewrite_checkpoint(ck, f[name], lambda h, changes=changes: h["__metadata__"].update(changes))
    for name, mutate in {
        "ck_offsets_outside": lambda h: first_tensor(h).update(data_offsets=[0, 1 << 40]),
        "ck_shape_wraps": lambda h: first_tensor(h).update(shape=[1 << 32, 1 << 32, 1 << 2]),
        "ck_dtype_unknown": lambda h: first_tensor(h).update(dtype="Q7"),
        "ck_shape_wrong": lambda h: first_tensor(h).update(shape=[3, 3]),
        "ck_offsets_overlap": overlap_second_tensor,
    }.items():
        f[name] = tmp / f"{name}.safetensors"
        rewrite_checkpoint(ck, f[name], mutate)
    blob = ck.read_bytes()
    f["ck_truncated"] = tmp / "ck_truncated.safetensors"
    f["ck_truncated"].write_bytes(blob[: len(blob) // 2])
    f["ck_header_huge"] = tmp / "ck_header_huge.safetensors"
    f["ck_header_huge"].write_bytes(struct.pack("<Q", 1 << 62) + blob[8:])
    f["ck_header_short"] = tmp / "ck_header_short.safetensors"
    f["ck_header_short"].write_bytes(blob[:5])
    # Fashion-MNIST directories, each with one file made wrong (the others are links to the real ones): written
    # bytes, or (a callable) a FIFO without a writer, a character device, a plain file with a sparse 20 GB tail.
    labels, images = "train-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz"
    for name, (file, content) in {
        "idx_bad_magic": (labels, gzipped_idx(0x0D, [60000], bytes(60000))),
        "idx_short_payload": (labels, gzipped_idx(0x08, [60000], bytes(100))),
        "idx_long_payload": (labels, gzipped_idx(0x08, [60000], bytes(60001))),
        "idx_huge_dims": (images, gzipped_idx(0x08, [60000, 0xFFFFFF, 0xFFFFFF], bytes(16))),
        "idx_wrong_rank": (images, gzipped_idx(0x08, [60000, 784], bytes(16))),
        "idx_labels_out_of_range": (labels, gzipped_idx(0x08, [60000], bytes([200]) * 60000)),
        "idx_count_mismatch": (labels, gzipped_idx(0x08, [59999], bytes(59999))),
        "idx_not_gzip": (labels, b"\x1f\x8b\x08\x00garbage that is not deflate"),
        "idx_images_28x29": (images, gzipped_idx(0x08, [60000, 28, 29], bytes(16))),
        "idx_trailing_zeros": (labels, gzip_with_zeros(idx_bytes(0x08, [60000], bytes(60000)), 200 << 20)),
        "idx_fifo": (labels, os.mkfifo),
        "idx_device": (labels, lambda p: os.symlink("/dev/zero", p)),
        "idx_trailing_sparse": (labels, lambda p: (p.write_bytes(struct.pack(">II", 0x801, 60000) + bytes(60000)),
                                                   os.truncate(p, 20 << 30))),
    }.items():
        d = tmp / name
        d.mkdir()
        for real in FASHION_MNIST.iterdir():
            if real.name != file:
                os.symlink(real, d / real.name)
        if callable(content):
            content(d / file)
        else:
            (d / file).write_bytes(content)
        f[name] = d
    f["corpus_prose"] = tmp / "corpus_prose"
    f["corpus_prose"].write_text("line one\nline two\nline three\n")
    return f


def load_cases(path):
    cases = []
    for number, line in enumerate(pathlib.Path(path).read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in line.split("|", 3)]
        if len(parts) != 4:
            sys.exit(f"{path}:{number}: expected 'class | exit code | message | arguments', got: {line}")
        cls, code, message, args = parts
        cases.append({"line": number, "class": cls, "code": int(code), "message": message, "args": args})
    return cases


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dpe")
    parser.add_argument("cases")
    parser.add_argument("--markdown")
    parser.add_argument("--only", default="")
    a = parser.parse_args()
    dpe = str(pathlib.Path(a.dpe).resolve())
    env = dict(os.environ, DPE_NUM_CPU_DEVICES="3", OMP_WAIT_POLICY="PASSIVE")
    cases = [c for c in load_cases(a.cases) if a.only in c["args"] or a.only in c["class"]]
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="dpe_bad_inputs_", dir=os.environ.get("TEST_TMPDIR")))
    try:
        fixtures = prepare(tmp, dpe, env)
        passed = failed = 0
        rows = []
        for c in cases:
            names = {k: str(v) for k, v in fixtures.items()}
            args = [arg.format(**names) for arg in shlex.split(c["args"])]
            case_env = dict(env)
            while args and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", args[0]):
                name, value = args.pop(0).split("=", 1)
                case_env[name] = value
            code, out, seconds = run([dpe] + args, case_env)
            lines = [l for l in out.splitlines() if l.strip()]
            message = c["message"].format(**names)
            observed = next((l for l in reversed(lines) if message in l), lines[-1] if lines else "")
            ok = code == c["code"] and message in out and not (tmp / "pwned").exists()
            if ok:
                passed += 1
            else:
                failed += 1
                why = "hung (killed)" if code is None else f"exit {code}"
                print(f"FAILED line {c['line']}: dpe {c['args']}\n  expected exit {c['code']} and '{c['message']}', "
                      f"got {why}:\n  " + "\n  ".join(lines[-6:]))
            rows.append((c, code, observed.replace(str(tmp), "$TMP"), ok, seconds))
        if a.markdown:
            write_markdown(pathlib.Path(a.markdown), rows)
        print(f"{passed} passed, {failed} failed")
        return 1 if failed else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_markdown(path, rows):
    def cell(text):
        return text.replace("|", "\\|").replace("`", "'")

    table = ["| # | class | command | expected | observed exit | observed message |", "|---|---|---|---|---|---|"]
    for i, (c, code, observed, ok, seconds) in enumerate(rows, 1):
        observed = observed if len(observed) <= 220 else observed[:217] + "..."
        table.append(f"| {i} | {c['class']} | `dpe {cell(c['args'])}` | {c['code']}, '{cell(c['message'])}' | "
                     f"{'hang' if code is None else code}{'' if ok else ' FAILED'} | {cell(observed)} |")
    text = path.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    path.write_text(text[:start] + "\n" + "\n".join(table) + "\n" + text[end:])


if __name__ == "__main__":
    sys.exit(main())
