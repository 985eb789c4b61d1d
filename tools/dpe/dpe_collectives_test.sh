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
grep -q '"op": "all_to_all"' "$TEST_TMPDIR/c.json" || { echo "FAILED: no JSON"; fail=1; }
out=$("$bin" collectives --ops frobnicate 2>&1) && { echo "FAILED: bad --ops accepted"; fail=1; }
grep -q "frobnicate" <<<"$out" || { echo "FAILED: message does not name the value: $out"; fail=1; }
exit $fail
