#!/usr/bin/env bash
# `mpirun -np 2 dpe collectives --dist mpi`: one table (process 0 prints) over the 4 members of 2 processes,
# every row correct (#wrong sums over all members); options --dist mpi cannot serve are errors before MPI starts.
# `mpirun -np 2 dpe devices --dist mpi`: the 4 replicas in global rank order, each with its process and place.
# A failure in one process: every process reports it, tagged with the rank, at once.
set -uo pipefail
bin="$1"
export DPE_NUM_CPU_DEVICES=2
# CI runs as root, which mpirun refuses unless told.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0
source "$(dirname "$0")/test_lib.sh"  # run, expect
out=$(timeout 120 mpirun -np 2 --oversubscribe --bind-to none "$bin" collectives --dist mpi --device-ids cpu:0,cpu:1 \
  -b 4K -e 64K -f 4 -n 2 -w 1 --json "$TEST_TMPDIR/c.json" 2>&1)
status=$?
echo "$out"
headers=$(grep -c '^# dpe collectives: 4 members (cpu:0 cpu:1 in each of 2 processes), backend mpi' <<<"$out")
rows=$(grep -cE '^  (all_reduce|broadcast|reduce|all_gather|reduce_scatter|all_to_all) ' <<<"$out")
# 6 collectives x 3 sizes (4K, 16K, 64K), printed once
if [[ $status -ne 0 || $headers -ne 1 || $rows -ne 18 ]]; then
  echo "FAILED: status $status, $headers headers (want 1), $rows rows (want 18)"; fail=1
fi
if awk '/^  [a-z_]+ /{ if ($NF != 0) bad=1 } END { exit !bad }' <<<"$out"; then echo "FAILED: a row has wrong elements"; fail=1; fi
python3 -c "import json, sys; r = json.load(open(sys.argv[1])); sys.exit(not (r['members'] == 4 and r['processes'] == 2
  and [x['op'] for x in r['results']] == [op for op in ['all_reduce', 'broadcast', 'reduce', 'all_gather',
  'reduce_scatter', 'all_to_all'] for _ in range(3)]))" \
  "$TEST_TMPDIR/c.json" ||
  { echo "FAILED: the JSON report"; fail=1; }
# A member of process 1 fails: both processes report, process 0 naming rank 1 and its reason; no wait for the
# timeout (5 minutes), no hang.
for attempt in 1 2 3; do
  out=$(timeout 60 mpirun -np 2 --oversubscribe --bind-to none "$bin" collectives --dist mpi --device-ids cpu:0 \
    -b 4K -e 16K --inject-failure-rank 1 2>&1)
  status=$?
  injected="all_reduce member 0 on cpu:0: failure injected by --inject-failure-rank"
  heard="rank 1 failed: $injected"
  if [[ $status -eq 0 || $status -eq 124 || $(grep -cF -- "$injected" <<<"$out") -ne 2 ]] || ! grep -qF -- "$heard" <<<"$out"; then
    echo "FAILED (attempt $attempt): status $status (124 = timed out); want both processes' reports:"; echo "$out" | grep '^dpe'
    fail=1
  fi
done

out=$(timeout 120 mpirun -np 2 --oversubscribe --bind-to none "$bin" devices --dist mpi --device-ids cpu:0,cpu:1 2>&1)
echo "$out" | tail -5
for line in "replica 0: cpu:0 of process 0 (local rank 0 of 2) on " "replica 1: cpu:1 of process 0 (local rank 0 of 2) on " \
            "replica 2: cpu:0 of process 1 (local rank 1 of 2) on " "replica 3: cpu:1 of process 1 (local rank 1 of 2) on "; do
  [[ $(grep -cF -- "$line" <<<"$out") -eq 1 ]] || { echo "FAILED: dpe devices --dist mpi: want '$line' once"; fail=1; }
done

# Options --dist mpi cannot serve, refused by one process before MPI starts.
dpe=(timeout 30 "$bin" collectives)
expect 2 "--backend cpu cannot be combined with --dist mpi" "${dpe[@]}" --dist mpi --backend cpu
expect 2 "--dist mpi-nccl needs CUDA devices (NCCL), got cpu:0; use --dist mpi for CPU devices" \
  "${dpe[@]}" --dist mpi-nccl --device-ids cpu:0
expect 2 "--dist mpi-nccl needs CUDA devices (NCCL), got cpu:1" timeout 30 "$bin" train --dist mpi-nccl --device-ids cpu:1
expect 105 "--dist: gloo not in" "${dpe[@]}" --dist gloo
exit $fail
