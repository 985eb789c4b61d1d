#!/usr/bin/env bash
# `dpe collectives` on CPU devices: every collective's rows are correct (#wrong 0) at odd group sizes, and
# bad options are errors.
set -uo pipefail
bin="$1"
export DPE_NUM_CPU_DEVICES=3
fail=0
out=$("$bin" collectives --device-ids cpu:0,cpu:1,cpu:2 -b 4096 -e 65536 -f 4 -n 2 -w 1 --json "$TEST_TMPDIR/c.json" 2>&1)
status=$?
echo "$out"
rows=$(grep -cE '^  (all_reduce|broadcast|reduce|all_gather|reduce_scatter|all_to_all) ' <<<"$out")
# 6 collectives x 3 sizes (4K, 16K, 64K)
if [[ $status -ne 0 || $rows -ne 18 ]]; then echo "FAILED: status $status, $rows rows (want 18)"; fail=1; fi
if awk '/^  [a-z_]+ /{ if ($NF != 0) bad=1 } END { exit !bad }' <<<"$out"; then echo "FAILED: a row has wrong elements"; fail=1; fi
python3 -c "import json, sys; r = json.load(open(sys.argv[1])); sys.exit(not (r['members'] == 3 and len(r['results']) == 18
  and r['results'][-1]['op'] == 'all_to_all' and all(x['wrong'] == 0 for x in r['results'])))" "$TEST_TMPDIR/c.json" ||
  { echo "FAILED: the JSON report"; fail=1; }
# expect STATUS PATTERN ARGS...: `dpe collectives ARGS` exits with STATUS within 30 s, output containing PATTERN.
expect() {
  local want_status="$1" pattern="$2"; shift 2
  out=$(timeout 30 "$bin" collectives "$@" 2>&1)
  local status=$?
  if [[ $status -ne $want_status ]] || ! grep -qF -- "$pattern" <<<"$out"; then
    echo "FAILED: dpe collectives $* -> status $status (want $want_status, 124 = timed out), want '$pattern', output:"
    echo "$out" | tail -5
    fail=1
  fi
}
# --stream: STREAM triad with a thread per CPU of the affinity mask (under taskset, one), and the all-reduce
# against the bandwidth limit it gives.
cpu=$(python3 -c 'import os; print(min(os.sched_getaffinity(0)))')
out=$(timeout 60 taskset -c "$cpu" "$bin" collectives --device-ids cpu:0,cpu:1 -b 1M -e 1M -n 2 -w 1 --ops all_reduce \
      --stream 2>&1) || { echo "FAILED: --stream: $out"; fail=1; }
grep -qE '^# host memory bandwidth \(STREAM triad, 1 threads\): [0-9.]+ GB/s$' <<<"$out" ||
  { echo "FAILED: --stream under taskset -c $cpu: $out"; fail=1; }
grep -qE '^# all_reduce 1 ?Mi?B?: [0-9.]+ GB/s algbw = [0-9]+% of the memory-bandwidth limit' <<<"$out" ||
  { echo "FAILED: no all_reduce line against the STREAM limit: $out"; fail=1; }
expect 2 "--ops 'frobnicate': item 1 'frobnicate' is not one of all_reduce,broadcast" --ops frobnicate
expect 2 "--ops 'all_reduce,,broadcast': item 2 is empty" --ops all_reduce,,broadcast
expect 105 "--backend: mpi not in" --backend mpi
# A member that fails aborts the group: the others are released at once (not after the group's 5-minute
# timeout) and the error is the failing member's own.
expect 2 "all_reduce member 1 on cpu:1: failure injected by --inject-failure-rank" \
  --device-ids cpu:0,cpu:1,cpu:2 -b 4K -e 16K -n 2 -w 1 --inject-failure-rank 1
expect 2 "all_to_all member 0 on cpu:0: failure injected" --device-ids cpu:0,cpu:1 --ops all_to_all -b 4K -e 4K \
  --inject-failure-rank 0
# Sizes that give an empty table are errors that explain the sizes.
expect 2 "--min-bytes 1 to --max-bytes 3 (factor 4) gives all_reduce no row: a row of S bytes holds S / 4 float32 elements (S >= 4)" \
  -b 1 -e 3
expect 2 "gives all_gather no row: a row of S bytes holds S / 4 float32 elements, a multiple of the 3 members for all_gather (S >= 12)" \
  --device-ids cpu:0,cpu:1,cpu:2 -b 4 -e 8
expect 0 "all_reduce               4            1" --device-ids cpu:0,cpu:1,cpu:2 -b 4 -e 8 --ops all_reduce -n 1 -w 0
expect 2 "--min-bytes 4096 is larger than --max-bytes 1024" -b 4096 -e 1024
expect 2 "--min-bytes 0: expected an integer in [1, 2^32] (a K, M, G or T suffix" -b 0
expect 2 "--min-bytes 1X: expected an integer in [1, 2^32]" -b 1X
expect 2 "--min-bytes -4K: expected an integer in [1, 2^32]" -b -4K
expect 2 "--max-bytes 8G: expected an integer in [1, 2^32]" -e 8G
expect 2 "--max-bytes 99999999999999999999: expected an integer in [1, 2^32]" -e 99999999999999999999
expect 2 "--factor 1: expected an integer in [2, 1024]" -f 1
expect 2 "--factor 4096: expected an integer in [2, 1024]" -f 4096
expect 2 "--iters 0: expected an integer in [1, 1000000]" -n 0
expect 2 "--iters 1.5: expected an integer in [1, 1000000]" -n 1.5
expect 2 "--warmup -1: expected an integer in [0, 1000000]" -w -1
expect 2 "--device-ids '': expected at least one device" --device-ids ""
expect 2 "--device-ids 'cpu:0,,cpu:1': item 2 is empty" --device-ids cpu:0,,cpu:1
expect 2 "--device-ids 'cpu:0,cpu:1,': item 3 is empty" --device-ids cpu:0,cpu:1,
expect 2 "--device-ids: cpu:7 does not exist: 3 cpu devices are available" --device-ids cpu:0,cpu:7
expect 2 "--device-ids lists cpu:0 more than once (items 1 and 2)" --device-ids cpu:0,cpu:0
expect 2 "--json $TEST_TMPDIR/no/c.json: the directory $TEST_TMPDIR/no does not exist" --json "$TEST_TMPDIR/no/c.json" -b 4K -e 4K
expect 2 "--json $TEST_TMPDIR: is a directory" --json "$TEST_TMPDIR" -b 4K -e 4K
exit $fail
