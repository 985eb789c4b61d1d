#!/usr/bin/env bash
# One allocation fails, at 40 points spread over a whole `dpe train` run (DDP on two CPU devices, the MLP and
# the CNN): the tool reports it in one "dpe train: ..." line (status 2 or 3) or trains to the end (0); it
# never aborts (134: std::terminate, an exception out of a destructor or a noexcept function) and never
# hangs (124). Found this way: a tensor's destructor growing the allocator's free list, and the command-line
# options built outside main's handlers. Where the failing allocation lands depends on thread timing, so
# each run probes different places, at random within 40 equal parts of the run; a failure names the
# allocation, to reproduce with DPE_FAIL_ALLOCATION=N LD_PRELOAD=bazel-bin/tools/reliability/fail_malloc.so.
# Tolerated, as in dpe_errors_test.sh (nothing outside those libraries can change it): 139 (oneDNN 2.6 uses a
# NULL from its own allocations; core/kernels/onednn_cpu.cc, Note [Exceptions and oneDNN]) and 1 after a
# "libgomp: ..." line. Not probed: the allocations before main (the static initialisers of CLI11's header,
# where nothing can catch); the sweep starts after those of `dpe train --help`.
set -uo pipefail
bin="$1"
shim="$(realpath "$2")"
# Set, so that the tool does not start itself again (tools/dpe/main.cc), which would restart the count.
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 DPE_NUM_CPU_DEVICES=2
# One OpenMP thread for oneDNN outside the devices too (the test-set evaluation runs on the main thread; each
# device's worker sets its own share, one here): an exception on one of oneDNN's OpenMP threads ends in
# std::terminate, which nothing outside oneDNN can prevent (a run of 2026-11-26 hit it in the evaluation).
export OMP_NUM_THREADS=1
fail=0
count() { DPE_COUNT_ALLOCATIONS=1 LD_PRELOAD="$shim" "$bin" "$@" 2>&1 >/dev/null | sed -n 's/^allocations: //p'; }
start=$(count train --help)
for model in mlp cnn; do
  args=(train --model "$model" --mode ddp --device-ids cpu:0,cpu:1 --epochs 1 --limit 128 --batch-size 64)
  total=$(count "${args[@]}")
  if ! [[ "$start" =~ ^[0-9]+$ && "$total" =~ ^[0-9]+$ && $total -gt $start ]]; then
    echo "FAILED: could not count allocations (--help: '$start', $model: '$total')"; exit 1
  fi
  echo "$model: allocations $start..$total probed at 40 points"
  declare -A seen=()
  for i in $(seq 0 39); do
    # A random place in the i-th fortieth, so that runs over time probe different allocations.
    n=$((start + (total - start) * i / 40 + RANDOM % ((total - start) / 40)))
    out=$(DPE_FAIL_ALLOCATION=$n LD_PRELOAD="$shim" timeout 60 "$bin" "${args[@]}" 2>&1)
    status=$?
    seen[$status]=$((${seen[$status]:-0} + 1))
    case "$status" in
      0|139) ;;
      2|3)
        if ! tail -1 <<<"$out" | grep -q "^dpe train: "; then
          echo "FAILED: allocation $n, $model: status $status without a 'dpe train: ' line:"; tail -3 <<<"$out"; fail=1
        fi ;;
      1) if ! grep -q "^libgomp: " <<<"$out"; then
           echo "FAILED: allocation $n, $model: status 1:"; tail -3 <<<"$out"; fail=1
         fi ;;
      *) echo "FAILED: allocation $n, $model: status $status (134 = abort, 124 = hang):"; tail -3 <<<"$out"; fail=1 ;;
    esac
  done
  for s in "${!seen[@]}"; do echo "  status $s: ${seen[$s]} runs"; done
  unset seen
done
exit $fail
