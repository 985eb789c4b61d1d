#!/usr/bin/env bash
# `dpe train` end to end on a slice of Fashion-MNIST: both modes learn, a checkpoint resumes at the next
# epoch, the JSON report is written, bad options are errors that name the value.
set -uo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
check() {  # check DESCRIPTION COMMAND...: the command must succeed
  local what="$1"; shift
  if ! out=$("$@" 2>&1); then echo "FAILED ($what): $*"; echo "$out"; fail=1; fi
}
for mode in dp ddp single; do
  check "$mode" "$bin" train --model mlp --mode "$mode" --epochs 1 --limit 1024 --batch-size 64 --lr 0.05 --json "$tmp/$mode.json"
  echo "$out" | tail -2
  acc=$(python3 -c "import json; print(json.load(open('$tmp/$mode.json'))['final_test_accuracy'])")
  python3 -c "import sys; sys.exit(0 if $acc > 0.55 else 1)" || { echo "FAILED: $mode accuracy $acc <= 0.55"; fail=1; }
done
check "save" "$bin" train --model cnn --mode ddp --sync-bn --epochs 1 --limit 256 --batch-size 64 --save-every 1 --checkpoint "$tmp/ck.safetensors"
[[ -s "$tmp/ck.safetensors" && ! -e "$tmp/ck.safetensors.tmp" ]] || { echo "FAILED: no checkpoint"; fail=1; }
check "resume" "$bin" train --model cnn --mode ddp --sync-bn --epochs 2 --limit 256 --batch-size 64 --resume "$tmp/ck.safetensors"
grep -q "resumed after epoch 1" <<<"$out" || { echo "FAILED: not resumed: $out"; fail=1; }
grep -q "^epoch 1/2" <<<"$out" && { echo "FAILED: epoch 1 ran again: $out"; fail=1; }
expect_error() {  # expect_error PATTERN ARGS...
  local pattern="$1"; shift
  if out=$("$bin" train "$@" 2>&1) || ! grep -q -- "$pattern" <<<"$out"; then
    echo "FAILED: dpe train $* should fail with '$pattern', got: $out"; fail=1
  fi
}
expect_error "needs --mode ddp" --model cnn --mode dp --sync-bn --limit 64
expect_error "--mode: frob not in" --mode frob
expect_error "cannot open $tmp/none/train-" --data-dir "$tmp/none" --limit 64
expect_error "a batch of 1 gives 1 non-empty shards for 2 devices" --mode ddp --batch-size 1 --limit 1 --model mlp
exit $fail
