#!/usr/bin/env python3
"""One training step's kernels from an Nsight Compute CSV (run_suite.sh's kernels_* rows).

  python3 tools/gpu/kernel_table.py results/bench/kernels_cnn_dpe.csv [more.csv ...]

The CSV is what `ncu --metrics gpu__time_duration.sum --csv --print-units base --log-file F` writes: one row
per kernel launch, in launch order. A program that runs the same step several times launches the same
sequence again and again; the step is the shortest tail sequence (of at least --min-kernels launches) that
repeats the one before it. For each file: the step's launches in order with their GPU time in microseconds,
the step's sum, and its launch count. The times are ncu's (kernels serialised, each timed alone): they say
where a step's GPU time goes, not how long the step takes.
"""
import argparse
import csv
import re
import sys


def launches(path):
    """[(kernel name, microseconds, grid, block)] in launch order; ncu's own lines (==PROF== ...) skipped."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "ns")
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit)
        if scale is None:
            sys.exit(f"kernel_table: {path}: unknown time unit '{unit}' (expected ns, us or ms)")
        rows.append((r["Kernel Name"], float(r["Metric Value"].replace(",", "")) * scale, r["Grid Size"],
                     r["Block Size"]))
    return rows


def last_step(rows, min_kernels):
    """The shortest tail of at least min_kernels launches equal, by kernel names, to the launches before it."""
    names = [r[0] for r in rows]
    for p in range(min_kernels, len(names) // 2 + 1):
        if names[-p:] == names[-2 * p:-p]:
            return rows[-p:]
    return None


def short(name):
    return re.sub(r"\(.*", "", name).replace("void ", "")[:100]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", nargs="+")
    p.add_argument("--min-kernels", type=int, default=20,
                   help="fewest launches a step may have (default 20: shorter repeats, such as the optimizer's "
                        "per-parameter kernels, are not a step)")
    args = p.parse_args()
    status = 0
    for path in args.csv:
        rows = launches(path)
        step = last_step(rows, args.min_kernels)
        print(f"== {path}: {len(rows)} launches in all")
        if step is None:
            print(f"   no repeating step of at least {args.min_kernels} launches (profile two or more steps)")
            status = 1
            continue
        for name, us, grid, block in step:
            print(f"{us:9.1f}  {short(name):<100} grid {grid} block {block}")
        print(f"   one step: {len(step)} launches, {sum(r[1] for r in step):.1f} us of GPU time")
    return status


if __name__ == "__main__":
    sys.exit(main())
