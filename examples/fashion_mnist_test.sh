#!/usr/bin/env bash
# Runs examples/fashion_mnist briefly in both modes (reads Debian's dataset-fashion-mnist): the test accuracy
# after two epochs on the first 1000 or 2000 images must be well above chance (0.1).
set -uo pipefail
bin="$1"
export DPE_NUM_CPU_DEVICES=2
fail=0
expect() {  # expect STATUS PATTERN ARGS...
  local want_status="$1" pattern="$2"
  shift 2
  out=$("$bin" "$@" 2>&1)
  status=$?
  if [[ $status -ne $want_status ]] || ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAILED: fashion_mnist $* -> status $status (want $want_status), output:"
    echo "$out"
    fail=1
  fi
}
expect 0 "^epoch 2/2  train loss .* test accuracy 0\.[5-9]" --mode dp --model cnn --limit 1000 --epochs 2
expect 0 "^epoch 2/2  train loss .* test accuracy 0\.[6-9]" --mode ddp --model mlp --limit 2000 --epochs 2
expect 0 "cnn, ddp mode on" --mode ddp --limit 300 --epochs 1
expect 2 "bad argument '--mode sgd'" --mode sgd
exit $fail
