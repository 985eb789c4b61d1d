#!/usr/bin/env bash
# `dpe bench` runs every mode on the same batch and writes one row per mode to the table, CSV and JSON.
set -uo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
out=$("$bin" bench --model mlp --batch-size 64 --steps 2 --warmup 1 --modes single,single-all,dp,ddp \
      --csv "$tmp/b.csv" --json "$tmp/b.json" 2>&1) || { echo "FAILED: $out"; exit 1; }
echo "$out"
rows=$(grep -cE '^dpe +(single|single-all|dp|ddp) ' <<<"$out")
[[ $rows -eq 4 ]] || { echo "FAILED: $rows table rows (want 4)"; fail=1; }
[[ $(wc -l < "$tmp/b.csv") -eq 5 ]] || { echo "FAILED: CSV lines"; fail=1; }
python3 - "$tmp/b.json" <<'PY' || fail=1
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert [r["config"] for r in rows] == ["single", "single-all", "dp", "ddp"], rows
for r in rows:
    assert r["samples_per_s"] > 0 and r["step_ms"] > 0, r
ddp = rows[3]
assert ddp["phases_ms"]["backward"] > 0 and ddp["devices"] == 2, ddp
PY
out=$("$bin" bench --modes frob 2>&1) && { echo "FAILED: bad mode accepted"; fail=1; }
exit $fail
