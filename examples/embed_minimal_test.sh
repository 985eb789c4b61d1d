#!/usr/bin/env bash
# Runs examples/embed_minimal in DP and DDP mode: the loss must fall below 0.03 in both (the noise floor is 0.01;
# the first 25 steps average about 2).
set -uo pipefail
bin="$1"
export DPE_NUM_CPU_DEVICES=2
fail=0
for mode_flag in "" "--ddp"; do
  out=$("$bin" $mode_flag 2>&1)
  status=$?
  mode=$([[ -n "$mode_flag" ]] && echo ddp || echo dp)
  if [[ $status -ne 0 ]] || ! grep -q "^embed_minimal: $mode mode on" <<<"$out" ||
     ! grep -q "ms: scatter .* backward .* optimizer" <<<"$out" || ! grep -Eq "^final loss 0\.0[0-2]" <<<"$out"; then
    echo "FAILED: embed_minimal $mode_flag -> status $status, output:"
    echo "$out"
    fail=1
  fi
done
exit $fail
