#!/usr/bin/env bash
# Checks `dpe devices` verdicts and messages on good and bad configurations.
set -uo pipefail
bin="$1"
export DPE_NUM_CPU_DEVICES=3
fail=0
expect() {  # expect STATUS PATTERN ARGS...
  local want_status="$1" pattern="$2"
  shift 2
  out=$("$bin" devices "$@" 2>&1)
  status=$?
  if [[ $status -ne $want_status ]] || ! grep -qF -- "$pattern" <<<"$out"; then
    echo "FAILED: dpe devices $* -> status $status (want $want_status), output:"
    echo "$out"
    fail=1
  fi
}
expect 0 "cpu:2" 
expect 0 "CPU instruction set: " 
DPE_MAX_CPU_ISA=avx2 expect 0 "CPU instruction set: avx2 (" 
# The tool caps OpenBLAS too, through OPENBLAS_CORETYPE (when the environment does not set it), where the cap is
# below the CPU.
unset OPENBLAS_CORETYPE
if grep -qw avx512f /proc/cpuinfo; then DPE_MAX_CPU_ISA=avx2 expect 0 "OpenBLAS core Haswell"; fi
if grep -qw avx512_bf16 /proc/cpuinfo; then DPE_MAX_CPU_ISA=avx512 expect 0 "OpenBLAS core SkylakeX"; fi
DPE_MAX_CPU_ISA=avx3 expect 2 "dpe devices: DPE_MAX_CPU_ISA='avx3': expected avx2, avx512, avx512_bf16 or native (unset: native)"
expect 0 "chunk sizes 2 2 1 -> 3 of 3 devices used: cpu:0 cpu:1 cpu:2" --device-ids cpu:0,cpu:1,cpu:2 --batch 5
expect 0 "chunk sizes 2 2 -> 2 of 3 devices used" --device-ids cpu:0,cpu:1,cpu:2 --batch 4
expect 0 "chunk sizes 2 1 1" --device-ids cpu:0,cpu:1,cpu:2 --batch 4 --split balanced
expect 0 "output_device = cpu:2" --device-ids cpu:0,cpu:1 --output-device cpu:2
expect 2 "contains cpu:1 more than once" --device-ids cpu:0,cpu:1,cpu:1
expect 2 "cpu:7 does not exist: 3 cpu devices are available (cpu:0..cpu:2)" --device-ids cpu:0,cpu:7
expect 2 "--device-ids ',': item 1 is empty" --device-ids ,
expect 2 "--device-ids '': expected at least one device" --device-ids ""
expect 2 "--device-ids 'cpu:0,,cpu:1': item 2 is empty" --device-ids cpu:0,,cpu:1
expect 2 "--device-ids 'cpu:0,cpu:1,': item 3 is empty" --device-ids cpu:0,cpu:1,
expect 2 "item 2: invalid device string ' cpu:1'" --device-ids "cpu:0, cpu:1"
expect 2 "item 1: invalid device string 'cpu:-1'" --device-ids cpu:-1
expect 2 "invalid device string 'cpu:0,cpu:1'" --device-ids cpu:0,cpu:1 --output-device cpu:0,cpu:1
expect 2 "invalid device string ''" --device-ids cpu:0,cpu:1 --output-device ""
expect 2 "--batch -1: expected an integer in [0, 2^31]" --device-ids cpu:0,cpu:1 --batch -1
expect 2 "--batch 99999999999999999999: expected an integer in [0, 2^31]" --device-ids cpu:0,cpu:1 --batch 99999999999999999999
expect 2 "--batch abc: expected an integer in [0, 2^31]" --device-ids cpu:0,cpu:1 --batch abc
expect 2 "--batch 2.5: expected an integer in [0, 2^31]" --device-ids cpu:0,cpu:1 --batch 2.5
expect 0 "chunk sizes 0 -> 1 of 2 devices used" --device-ids cpu:0,cpu:1 --batch 0
expect 107 "--batch requires --device-ids" --batch 5
expect 107 "--output-device requires --device-ids" --output-device cpu:0
expect 107 "--split requires --device-ids" --split balanced
expect 105 "--split: even not in {chunk,balanced}" --device-ids cpu:0 --split even
expect 2 "mixes cpu:0 and cuda:0" --device-ids cpu:0,cuda:0
expect 2 "invalid device string 'gpu:0'" --device-ids gpu:0
expect 2 "output_device" --device-ids cpu:0 --output-device cpu:9
expect 109 "not expected: --frobnicate" --frobnicate
expect 0 "List devices" --help
expect 0 "DDP mode needs a batch of at least 2" --device-ids cpu:0,cpu:1
exit $fail
