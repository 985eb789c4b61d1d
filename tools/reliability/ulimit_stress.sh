#!/usr/bin/env bash
# A soak run, not a test (it takes as long as it is given): dpe_errors_test.sh's `ulimit -v` trainings (both
# models, DDP and DP mode) over and over, to catch what happens once in thousands of runs. A run that outlives
# 60 s is a hang: every thread's stack goes to DIR/stacks_N.txt (gdb) and its output to DIR/out_N.txt, and the
# loop goes on. Status 0, 2, 3 and 139 (oneDNN's own NULL dereference, tools/dpe/dpe_errors_test.sh) are
# expected; any other is printed, and the last line counts the runs that ended with each status.
# Found this way (2026-11-26): a DDP partner waiting in the all-reduce for the timeout because the failed
# replica's abort was lost out of memory (1 run in 2621; none in 10,270 after the fix).
#
#   tools/reliability/ulimit_stress.sh bazel-bin/tools/dpe/dpe SECONDS DIR
#
# Copy the binary somewhere first if you build while it runs: bazel-bin follows the last build's configuration.
set -uo pipefail
bin="$(realpath "$1")" seconds="$2" dir="$3"
[[ -x "$bin" && -f "$bin" ]] || { echo "ulimit_stress: '$1' is not an executable file"; exit 2; }
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "ulimit_stress: SECONDS '$seconds' is not a whole number"; exit 2; }
mkdir -p "$dir"
export DPE_NUM_CPU_DEVICES=2 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1  # as dpe_errors_test.sh
# The address space the tool needs to start, by bisection (it differs between the CPU-only and CUDA builds).
lo=10000 hi=16000000
while ((hi - lo > 2000)); do
  mid=$(((lo + hi) / 2))
  if (ulimit -v "$mid"; "$bin" train --help >/dev/null 2>&1); then hi=$mid; else lo=$mid; fi
done
echo "the tool starts under ulimit -v $hi (KiB)"
runs=0 hangs=0 end=$((SECONDS + seconds))
declare -A statuses=()  # exit status -> runs that ended with it
while ((SECONDS < end)); do
  for extra in 2000 12000 25000 37000 50000 62000 75000 87000 100000 125000 150000 200000 300000; do
    for run in "mlp ddp" "cnn ddp" "mlp dp" "cnn dp"; do
      read -r model mode <<<"$run"
      kib=$((hi + extra))
      (ulimit -v "$kib"; exec "$bin" train --model "$model" --mode "$mode" --device-ids cpu:0,cpu:1 --epochs 1 \
         --limit 256 --batch-size 64 >"$dir/out.txt" 2>&1) &
      pid=$!
      for ((w = 0; w < 600; ++w)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      runs=$((runs + 1))
      if kill -0 "$pid" 2>/dev/null; then
        hangs=$((hangs + 1))
        echo "HANG: ulimit -v $kib, $model $mode, run $runs: $dir/stacks_$runs.txt"
        gdb -p "$pid" -batch -ex "thread apply all bt 25" >"$dir/stacks_$runs.txt" 2>&1
        cp "$dir/out.txt" "$dir/out_$runs.txt"
        kill -9 "$pid"
      fi
      wait "$pid" 2>/dev/null
      status=$?
      statuses[$status]=$((${statuses[$status]:-0} + 1))
      case $status in
        0|2|3|139|137) ;;  # 137: the hang killed above
        *) echo "status $status: ulimit -v $kib, $model $mode: $(tail -1 "$dir/out.txt")" ;;
      esac
    done
  done
done
tally=""
for status in $(printf '%s\n' "${!statuses[@]}" | sort -n); do tally+=", ${statuses[$status]} x status $status"; done
echo "$runs runs, $hangs hangs$tally"
((hangs == 0))
