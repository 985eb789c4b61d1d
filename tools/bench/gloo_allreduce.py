#!/usr/bin/python3
"""PyTorch's all-reduce across processes, the reference for `dpe collectives --dist mpi`
(tools/bench/allreduce_vs_gloo.sh runs both).

torch.distributed with the gloo backend (PyTorch's CPU backend; Debian's PyTorch 1.13 has no MPI backend),
--processes processes spawned with a file:// rendezvous (no network), each with one torch thread. For every
size from --min-bytes to --max-bytes (x4), an in-place all_reduce (SUM) of a float32 tensor of size / 4
elements: --warmup untimed calls, a barrier, then --iters timed ones on rank 0. Prints one JSON object per
size on stdout: {"bytes": 67108864, "time_us": 46833.0, "algbw_gbs": 1.433}, algbw = bytes / time (GB = 1e9),
the nccl-tests convention dpe collectives uses. Exit status 3 when torch cannot be imported.
"""
import argparse
import json
import os
import sys
import tempfile
import time


def worker(rank, args, init_file):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=args.processes)
    size = args.min_bytes
    while size <= args.max_bytes:
        t = torch.full((size // 4,), float(rank + 1))
        for _ in range(args.warmup):
            dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(t)
        seconds = (time.perf_counter() - start) / args.iters
        if rank == 0:
            print(json.dumps({"bytes": size, "time_us": round(seconds * 1e6, 1),
                              "algbw_gbs": round(size / seconds / 1e9, 3)}), flush=True)
        size *= 4
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--min-bytes", type=int, default=1 << 10)
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    if args.processes < 2 or args.min_bytes < 4 or args.max_bytes < args.min_bytes or args.iters < 1 or args.warmup < 0:
        parser.error("expected --processes >= 2, 4 <= --min-bytes <= --max-bytes, --iters >= 1, --warmup >= 0")
    try:
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"gloo_allreduce.py: cannot import torch ({e}); install python3-torch", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(args, os.path.join(tmp, "rendezvous")), nprocs=args.processes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
