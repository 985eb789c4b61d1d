#!/usr/bin/env bash
# All-reduce across 2 processes on this machine, dpe against PyTorch, in one run: `mpirun -np 2 dpe collectives
# --dist mpi` (one CPU device per process; Open MPI, hierarchical backend) and tools/bench/gloo_allreduce.py
# (torch.distributed, gloo, 2 processes). Prints algbw per size and dpe / PyTorch. Build dpe first
# (bazel build //tools/dpe). Usage: tools/bench/allreduce_vs_gloo.sh [MAX_BYTES (default 64M)]
set -euo pipefail
cd "$(dirname "$0")/../.."
max="${1:-64M}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# As root (CI, containers) Open MPI asks for these two.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np 2 bazel-bin/tools/dpe/dpe collectives --dist mpi --device-ids cpu:0 --ops all_reduce -b 1K -e "$max" \
  --json "$tmp/dpe.json" >/dev/null
max_bytes=$(python3 -c "import json; print(int(max(r['bytes'] for r in json.load(open('$tmp/dpe.json'))['results'])))")
/usr/bin/python3 tools/bench/gloo_allreduce.py --min-bytes 1024 --max-bytes "$max_bytes" > "$tmp/gloo.jsonl"
python3 - "$tmp/dpe.json" "$tmp/gloo.jsonl" <<'PY'
import json, sys
dpe = {int(r["bytes"]): r for r in json.load(open(sys.argv[1]))["results"]}
gloo = {r["bytes"]: r for r in map(json.loads, open(sys.argv[2]))}
print("# all_reduce across 2 processes (1 CPU device each), float32, algbw GB/s (1e9)")
print(f"# {'size':>10} {'dpe mpi':>9} {'torch gloo':>11} {'dpe/gloo':>9}")
for size in sorted(dpe):
    if size in gloo:
        a, b = dpe[size]["algbw_gbs"], gloo[size]["algbw_gbs"]
        print(f"  {size:>10} {a:>9.2f} {b:>11.2f} {a / b if b else float('inf'):>8.2f}x")
PY
