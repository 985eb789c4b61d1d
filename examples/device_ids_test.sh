#!/usr/bin/env bash
# Runs examples/device_ids and checks the result or error of each configuration.
set -uo pipefail
out=$("$1" 2>&1)
status=$?
fail=0
expect() {  # expect PATTERN: a line of the output matches
  if ! grep -q -- "$1" <<<"$out"; then
    echo "FAILED: no line matches '$1'"
    fail=1
  fi
}
expect "^device_ids cpu:0 cpu:1 .*-> batch 8: chunk sizes 4 4 on cpu:0 cpu:1 (2 of 2 devices), gathered on cpu:0"
expect "^device_ids cpu:0 cpu:1, output_device cpu:2 .*-> .*gathered on cpu:2"
expect "^device_ids cpu:0..cpu:3, small batch  .*-> batch 5: chunk sizes 2 2 1 on cpu:0 cpu:1 cpu:2 (3 of 4 devices)"
expect "Balanced split .*-> batch 5: chunk sizes 2 1 1 1 on cpu:0 cpu:1 cpu:2 cpu:3 (4 of 4 devices)"
expect "^device_ids cpu:0..cpu:3, DDP  .*-> batch 8: chunk sizes 2 2 2 2"
expect "^device_ids cpu:1 cpu:3 (master on cpu:1) .*-> batch 6: chunk sizes 3 3 on cpu:1 cpu:3"
expect "DDP, batch of 3 .*-> batch 3: chunk sizes 1 1 1 0 on cpu:0 cpu:1 cpu:2 (3 of 4 devices)"
expect "(duplicate) .*-> error: .*device_ids contains cpu:1 more than once"
expect "(no such device) .*-> error: .*cpu:9 does not exist: 4 cpu devices are available (cpu:0..cpu:3)"
expect "(mixed kinds) .*-> error: .*device_ids mixes cpu:0 and cuda:0"
expect "(empty) .*-> error: .*device_ids is empty"
expect "^output_device cpu:9 .*-> error: .*output_device: cpu:9 does not exist"
expect "master on cpu:0 .*-> error: .*module must have its parameters and buffers on device_ids\[0\] = cpu:1"
if [[ $status -ne 0 || $fail -ne 0 ]]; then
  echo "status $status, output:"
  echo "$out"
  exit 1
fi
