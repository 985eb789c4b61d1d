#!/usr/bin/env bash
# `dpe train` end to end on a slice of Fashion-MNIST: both modes learn, a checkpoint resumes at the next
# epoch and bit for bit like an uninterrupted run, DDP trains every epoch whatever N mod batch, the JSON report
# is written; bad options and bad checkpoints are errors that name the value, raised at start-up.
set -uo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
check() {  # check DESCRIPTION COMMAND...: the command must succeed
  local what="$1"; shift
  if ! out=$("$@" 2>&1); then echo "FAILED ($what): $*"; echo "$out"; fail=1; fi
}
# expect STATUS PATTERN ARGS...: `dpe train ARGS` exits with STATUS within 30 s (start-up checks do no work)
# and its output contains PATTERN.
expect() {
  local want_status="$1" pattern="$2"; shift 2
  out=$(timeout 30 "$bin" train "$@" 2>&1)
  local status=$?
  if [[ $status -ne $want_status ]] || ! grep -qF -- "$pattern" <<<"$out"; then
    echo "FAILED: dpe train $* -> status $status (want $want_status, 124 = timed out), want '$pattern', output:"
    echo "$out" | tail -5
    fail=1
  fi
}
expect_error() { expect 2 "$@"; }  # expect_error PATTERN ARGS...

for mode in dp ddp single; do
  check "$mode" "$bin" train --model mlp --mode "$mode" --epochs 1 --limit 1024 --batch-size 64 --lr 0.05 --json "$tmp/$mode.json"
  echo "$out" | tail -2
  acc=$(python3 -c "import json; print(json.load(open('$tmp/$mode.json'))['final_test_accuracy'])")
  python3 -c "import sys; sys.exit(0 if $acc > 0.55 else 1)" || { echo "FAILED: $mode accuracy $acc <= 0.55"; fail=1; }
done
# --deterministic: one device in DDP mode and two in DP mode write the same checkpoint, byte for byte.
check "det ddp 1" "$bin" train --model cnn --mode ddp --device-ids cpu:0 --deterministic --epochs 1 --limit 256 --batch-size 32 \
  --save-every 1 --checkpoint "$tmp/det1.safetensors"
check "det dp 2" "$bin" train --model cnn --mode dp --device-ids cpu:0,cpu:1 --deterministic --epochs 1 --limit 256 --batch-size 32 \
  --save-every 1 --checkpoint "$tmp/det2.safetensors"
cmp -s "$tmp/det1.safetensors" "$tmp/det2.safetensors" || { echo "FAILED: --deterministic checkpoints differ"; fail=1; }
# The same in channels-last memory (its BatchNorm sums blocks of a fixed size, whatever the device count).
check "det ddp 1 cl" "$bin" train --model cnn --mode ddp --device-ids cpu:0 --deterministic --channels-last --epochs 1 \
  --limit 256 --batch-size 32 --save-every 1 --checkpoint "$tmp/det1cl.safetensors"
check "det dp 2 cl" "$bin" train --model cnn --mode dp --device-ids cpu:0,cpu:1 --deterministic --channels-last --epochs 1 \
  --limit 256 --batch-size 32 --save-every 1 --checkpoint "$tmp/det2cl.safetensors"
cmp -s "$tmp/det1cl.safetensors" "$tmp/det2cl.safetensors" || { echo "FAILED: --channels-last --deterministic checkpoints differ"; fail=1; }
expect_error "--deterministic cuts every batch into its own virtual shards; --split auto does not apply" --deterministic --split auto
# --channels-last: the same training as NCHW memory, up to float32 rounding (the kernels sum in other orders).
for layout in nchw cl; do
  check "$layout" "$bin" train --model cnn --mode ddp --epochs 1 --limit 256 --batch-size 32 --json "$tmp/$layout.json" \
    $([[ $layout == cl ]] && echo --channels-last)
done
python3 - "$tmp/nchw.json" "$tmp/cl.json" <<'PY' || { echo "FAILED: --channels-last trains differently"; fail=1; }
import json, sys
a, b = (json.load(open(p))["epochs"][0]["train_loss"] for p in sys.argv[1:])
assert abs(float(a) - float(b)) <= 1e-4 * abs(float(a)), (a, b)
PY
expect_error "--channels-last: the tiny-llama model's inputs are token ids (N, T), not images" --model tiny-llama --channels-last
expect 107 "--virtual-shards requires --deterministic" --virtual-shards 4
# --on-device-failure drop_device: a device whose step fails is dropped, the step redone on the others, and
# training goes on; the warning and the JSON say so, with the devices that remain.
# expect_cpu1_dropped NAME WARNING INJECTION...: DDP on cpu:0..2 with the injection trains to the end without
# cpu:1, printing WARNING (a grep pattern), and its JSON names the survivors.
expect_cpu1_dropped() {
  local name="$1" warning="$2"; shift 2
  check "$name" env DPE_NUM_CPU_DEVICES=3 timeout 60 "$bin" train --model mlp --mode ddp --device-ids cpu:0,cpu:1,cpu:2 \
    --epochs 1 --limit 1024 --batch-size 63 --lr 0.05 --on-device-failure drop_device "$@" --json "$tmp/$name.json"
  grep -q "^warning: dropped cpu:1 (replica 1): $warning" <<<"$out" || { echo "FAILED ($name): no warning: $out"; fail=1; }
  python3 - "$tmp/$name.json" <<'PY' || { echo "FAILED: the $name JSON"; fail=1; }
import json, sys
r = json.load(open(sys.argv[1]))
assert r["devices"] == "cpu:0 cpu:2" and len(r["recovered_failures"]) == 1 and r["final_test_accuracy"] > 0.55, r
PY
}
expect_cpu1_dropped drop "replica 1 on cpu:1: failure injected by --inject-failure on cpu:1" --inject-failure cpu:1@3
expect 2 "replica 1 on cpu:1: failure injected by --inject-failure on cpu:1" --model mlp --mode ddp --device-ids cpu:0,cpu:1 \
  --limit 256 --epochs 1 --inject-failure cpu:1@0
# A device stuck for good (its loss never returns: --inject-hang) no longer hangs the run: with --timeout 1 its
# partners time out on it in the all-reduce, a second later it is declared lost, and drop_device goes on without
# it (the JSON names the survivors); under the default policy the run ends with the timeout naming it.
expect_cpu1_dropped hang "it did not arrive in time: .*waiting for cpu:1 (rank 1)" --inject-hang cpu:1@3 --timeout 1
expect 2 "timed out after 500 ms on cpu:0: waiting for cpu:1 (rank 1)" --model mlp --mode ddp --device-ids cpu:0,cpu:1 \
  --limit 256 --epochs 1 --inject-hang cpu:1@1 --timeout 0.5
expect_error "--timeout 1e+09: expected seconds in (0, 10000000]" --timeout 1e9 --limit 10
# --split auto trains (uneven shards, gradients weighted by shard size).
# --precision bf16 (autocast) with --reduce-dtype bf16: learns like float32, and the report says so. fp16 is
# CUDA's (refused on CPU devices, naming one).
check "bf16" "$bin" train --model mlp --mode ddp --precision bf16 --reduce-dtype bf16 --epochs 1 --limit 1024 \
  --batch-size 64 --lr 0.05 --json "$tmp/bf16.json"
grep -q "precision bf16" <<<"$out" || { echo "FAILED: no 'precision bf16' in the header: $out"; fail=1; }
# Without bfloat16 instructions (the CPU's, or DPE_MAX_CPU_ISA below avx512_bf16: this test's capped runs) autocast
# computes in float32, and says so once.
isa=$("$bin" devices | sed -n 's/^CPU instruction set: \([a-z0-9_]*\) .*/\1/p')
warnings=$(grep -c "dpe: warning: this CPU has no bfloat16 instructions" <<<"$out")
if [[ -z $isa ]] || { [[ $isa == avx512_bf16 ]] && ((warnings != 0)); } || { [[ $isa != avx512_bf16 ]] && ((warnings != 1)); }; then
  echo "FAILED: instruction set '$isa' and $warnings float32 warnings: $out"
  fail=1
fi
python3 - "$tmp/bf16.json" <<'PY' || { echo "FAILED: the bf16 JSON report"; fail=1; }
import json, sys
r = json.load(open(sys.argv[1]))
assert r["precision"] == "bf16" and r["reduce_dtype"] == "bf16" and r["final_test_accuracy"] > 0.55, r
assert r["epochs"][0]["skipped_steps"] == 0 and r["epochs"][0]["loss_scale"] == 1, r
PY
expect_error "--precision fp16 runs on CUDA devices only (float16 products and a gradient scaler); got cpu:0" --cpu-devices 2 --precision fp16
expect_error "--reduce-dtype bf16 compresses DDP's gradient all-reduce; --mode dp has none" --mode dp --reduce-dtype bf16
check "split auto" "$bin" train --model mlp --mode ddp --split auto --epochs 1 --limit 1024 --batch-size 64 --lr 0.05
grep -q "final test accuracy 0\.[5-9]" <<<"$out" || { echo "FAILED: --split auto accuracy: $out"; fail=1; }
# --mode auto: times dp and ddp, says which it keeps, and reports it in the JSON; trains as well as either.
check "auto" "$bin" train --model mlp --mode auto --epochs 1 --limit 1024 --batch-size 64 --lr 0.05 --json "$tmp/auto.json"
grep -qE "^auto: (dp|ddp) \(dp [0-9.]+ ms/step, ddp [0-9.]+ ms/step\)" <<<"$out" || { echo "FAILED: no auto choice line: $out"; fail=1; }
python3 - "$tmp/auto.json" <<'PY' || { echo "FAILED: the auto JSON report"; fail=1; }
import json, sys
r = json.load(open(sys.argv[1]))
assert r["mode"] == "auto" and r["auto"]["chosen"] == r["mode_used"] in ("dp", "ddp"), r
assert r["auto"]["dp_step_ms"] > 0 and r["auto"]["ddp_step_ms"] > 0 and r["final_test_accuracy"] > 0.55, r
PY
check "save" "$bin" train --model cnn --mode ddp --sync-bn --epochs 1 --limit 256 --batch-size 64 --save-every 1 --checkpoint "$tmp/ck.safetensors"
[[ -s "$tmp/ck.safetensors" ]] || { echo "FAILED: no checkpoint"; fail=1; }
leftovers=("$tmp"/ck.safetensors.tmp*)
[[ ! -e "${leftovers[0]}" ]] || { echo "FAILED: temporary left behind: ${leftovers[*]}"; fail=1; }
check "resume" "$bin" train --model cnn --mode ddp --sync-bn --epochs 2 --limit 256 --batch-size 64 --resume "$tmp/ck.safetensors"
grep -q "resumed after epoch 1" <<<"$out" || { echo "FAILED: not resumed: $out"; fail=1; }
grep -q "^epoch 1/2" <<<"$out" && { echo "FAILED: epoch 1 ran again: $out"; fail=1; }

# DDP, N mod batch in [1, devices - 1]: 23 samples, batch 7, 3 devices leave a last batch of 2. It trains as it
# is (the third device takes part with zeros), so every epoch trains all its steps and the checkpoint is
# written; with SyncBatchNorm, which needs a sample on every device, it is padded to 3.
rm -f "$tmp/pad.ck"
check "ddp-short-last-batch" "$bin" train --model mlp --mode ddp --cpu-devices 3 --batch-size 7 --limit 23 --epochs 2 \
  --save-every 2 --checkpoint "$tmp/pad.ck"
grep -q "last batch of 2 unpadded (DDP devices without a sample take part with zeros)" <<<"$out" ||
  { echo "FAILED: no unpadded note: $out"; fail=1; }
[[ $(grep -c "^epoch [12]/2 loss" <<<"$out") -eq 2 ]] || { echo "FAILED: not every epoch finished: $out"; fail=1; }
grep -q "4/4" <<<"$out" || { echo "FAILED: the 4th step of an epoch did not run: $out"; fail=1; }
[[ -s "$tmp/pad.ck" ]] || { echo "FAILED (ddp-pad-last-batch): no checkpoint"; fail=1; }
check "ddp-drop-last" "$bin" train --model mlp --mode ddp --cpu-devices 3 --batch-size 7 --limit 23 --epochs 2 --drop-last
grep -q "last 2 dropped (--drop-last)" <<<"$out" || { echo "FAILED: no drop note: $out"; fail=1; }
[[ $(grep -c "^epoch [12]/2 loss" <<<"$out") -eq 2 ]] || { echo "FAILED (drop-last): not every epoch finished: $out"; fail=1; }
# ZeRO checkpoints hold the whole optimizer, as plain DDP's: 1 epoch of ZeRO-2 on 3 devices resumed as ZeRO-1 on 2
# gives plain DDP's 2-epoch checkpoint on 2 byte for byte (the deterministic mode: the same bits for any device
# count; the checkpoint records each device's generator, hence the same count at the end).
common=(--model mlp --mode ddp --deterministic --limit 240 --batch-size 60 --schedule constant --optimizer adam --save-every 1)
check "zero-ddp" "$bin" train "${common[@]}" --epochs 2 --checkpoint "$tmp/zd.ck"
check "zero2" "$bin" train "${common[@]}" --zero 2 --cpu-devices 3 --epochs 1 --checkpoint "$tmp/z2.ck"
check "zero1-resumed" "$bin" train "${common[@]}" --zero 1 --cpu-devices 2 --epochs 2 --checkpoint "$tmp/z1.ck" \
  --resume "$tmp/z2.ck"
cmp -s "$tmp/zd.ck" "$tmp/z1.ck" || { echo "FAILED: ZeRO-2 then ZeRO-1 differs from plain DDP's checkpoint"; fail=1; }

# With SyncBatchNorm and fewer samples than devices: the one batch is padded, wrapping around the epoch's order.
check "ddp-pad-wraps" "$bin" train --model cnn --mode ddp --sync-bn --cpu-devices 3 --batch-size 7 --limit 2 --epochs 1
grep -q "last batch of 2 padded to 3" <<<"$out" || { echo "FAILED (ddp-pad-wraps): $out"; fail=1; }

# Resume is exact: 1 epoch + a resumed 2nd gives the same checkpoint, byte for byte (weights, optimizer state,
# generator offsets), as 2 epochs in one run. (Constant schedule: a cosine schedule depends on --epochs, so a
# 1-epoch run is not the first half of a 2-epoch one.) Before check_model_name, model_loss built a model after
# the resume restored the generators, and the offsets differed.
for mode in ddp dp; do
  common=(--model mlp --mode "$mode" --limit 256 --batch-size 60 --schedule constant --save-every 1)
  check "exact-$mode-a" "$bin" train "${common[@]}" --epochs 2 --checkpoint "$tmp/a.ck" --json "$tmp/a.json"
  check "exact-$mode-b" "$bin" train "${common[@]}" --epochs 1 --checkpoint "$tmp/b.ck"
  b_accuracy=$(grep -o "final test accuracy [0-9.]*" <<<"$out")
  check "exact-$mode-c" "$bin" train "${common[@]}" --epochs 2 --checkpoint "$tmp/c.ck" --resume "$tmp/b.ck"
  cmp -s "$tmp/a.ck" "$tmp/c.ck" || { echo "FAILED: $mode resumed checkpoint differs from the uninterrupted one"; fail=1; }
  # Resuming a finished run trains nothing and reports the loaded model's real accuracy.
  check "finished-$mode" "$bin" train "${common[@]}" --epochs 1 --resume "$tmp/b.ck" --json "$tmp/f.json"
  grep -q "nothing left to train: $tmp/b.ck is after epoch 1 and --epochs is 1" <<<"$out" || { echo "FAILED: $out"; fail=1; }
  grep -qF "$b_accuracy" <<<"$out" || { echo "FAILED: finished run reports '$out', want '$b_accuracy'"; fail=1; }
  grep -q "^epoch" <<<"$out" && { echo "FAILED: a finished run trained: $out"; fail=1; }
  [[ -s "$tmp/f.json" ]] || { echo "FAILED: no JSON for a finished run"; fail=1; }
done

# Checkpoints with bad training state: the metadata rewritten, the tensors kept (a valid safetensors file).
patch_checkpoint() {  # patch_checkpoint SRC DST KEY VALUE
  python3 - "$@" <<'PY'
import json, struct, sys
src, dst, key, value = sys.argv[1:]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
header["__metadata__"][key] = value
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)  # data stays 8-byte aligned
open(dst, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
}
common=(--model mlp --mode ddp --limit 256 --batch-size 60 --schedule constant)
patch_checkpoint "$tmp/b.ck" "$tmp/neg.ck" training.epoch -4
expect_error "--resume $tmp/neg.ck: the checkpoint says training.epoch -4, training.step 5; expected counts >= 0" \
  "${common[@]}" --epochs 2 --resume "$tmp/neg.ck"
patch_checkpoint "$tmp/b.ck" "$tmp/negstep.ck" training.step -1
expect_error "training.step -1; expected counts >= 0" "${common[@]}" --epochs 2 --resume "$tmp/negstep.ck"
# A huge epoch used to hang replaying the scheduler; now it is past --epochs: nothing to train, at once.
patch_checkpoint "$tmp/b.ck" "$tmp/huge.ck" training.epoch 4611686018427387904
expect 0 "nothing left to train: $tmp/huge.ck is after epoch 4611686018427387904 and --epochs is 2" \
  "${common[@]}" --epochs 2 --resume "$tmp/huge.ck"
patch_checkpoint "$tmp/b.ck" "$tmp/text.ck" training.epoch one
expect_error "training.epoch" "${common[@]}" --epochs 2 --resume "$tmp/text.ck"
expect_error "--resume $tmp/none.ck: no such file" "${common[@]}" --resume "$tmp/none.ck"
expect_error "--resume $tmp: is not a regular file" "${common[@]}" --resume "$tmp"
# Another model or optimizer is a changed option, named before anything is loaded; with --override the
# checkpoint itself refuses to fit.
expect_error "--model was 'mlp' in the checkpoint's run and is 'cnn' now" "${common[@]/mlp/cnn}" --resume "$tmp/b.ck"
expect_error "load_checkpoint" "${common[@]/mlp/cnn}" --resume "$tmp/b.ck" --override model  # an mlp checkpoint
expect_error "--optimizer was 'sgd' in the checkpoint's run and is 'adam' now" "${common[@]}" --optimizer adam --resume "$tmp/b.ck"
expect_error "the state belongs to a SGD optimizer, not Adam" "${common[@]}" --optimizer adam --resume "$tmp/b.ck" \
  --override optimizer

# Bad options: refused at start-up, naming the option, the value and what was expected.
expect_error "needs --mode ddp" --model cnn --mode dp --sync-bn --limit 64
expect_error "--dist mpi needs --mode ddp or dp (--mode auto switches modes, which it cannot across processes)" --mode auto --dist mpi
expect 105 "--mode: frob not in" --mode frob
expect 105 "--model: resnet not in" --model resnet
expect 105 "--optimizer: lbfgs not in" --optimizer lbfgs
expect 105 "--schedule: linear not in" --schedule linear
expect 109 "The following argument was not expected: --frobnicate" --frobnicate
expect_error "cannot open $tmp/none/train-" --data-dir "$tmp/none" --limit 64
expect_error "--batch-size 0: expected an integer in [1, 2^31]" --batch-size 0
expect_error "--batch-size -1: expected an integer in [1, 2^31]" --batch-size -1
expect_error "--batch-size 4294967296: expected an integer in [1, 2^31]" --batch-size 4294967296
expect_error "--batch-size 12.5: expected an integer" --batch-size 12.5
expect_error "--batch-size 0x40: expected an integer" --batch-size 0x40
expect_error "--epochs 99999999999999999999999: expected an integer in [1, 1000000]" --epochs 99999999999999999999999
expect_error "--epochs 0: expected an integer in [1, 1000000]" --epochs 0
expect_error "--epochs 1000001: expected an integer in [1, 1000000]" --epochs 1000001
expect_error "--epochs ten: expected an integer" --epochs ten
expect_error "--epochs '': expected an integer" --epochs ""
expect_error "--cpu-devices 100000: expected an integer in [1, 1024]" --cpu-devices 100000
expect_error "--cpu-devices 0: expected an integer in [1, 1024]" --cpu-devices 0
expect_error "--lr inf: expected a finite number > 0" --lr inf
expect_error "--lr nan: expected a finite number > 0" --lr nan
expect_error "--lr 0: expected a finite number > 0" --lr 0
expect_error "--lr -0.1: expected a finite number > 0" --lr -0.1
expect_error "--lr 1e999: expected a finite number > 0" --lr 1e999
expect_error "--momentum -0.5: expected a finite number >= 0" --momentum -0.5
expect_error "--momentum inf: expected a finite number >= 0" --momentum inf
expect_error "--weight-decay nan: expected a finite number >= 0" --weight-decay nan
expect_error "--weight-decay -1: expected a finite number >= 0" --weight-decay -1
expect_error "--seed -1: expected an integer in [0, 2^64-1]" --seed -1
expect_error "--seed 18446744073709551616: expected an integer in [0, 2^64-1]" --seed 18446744073709551616
expect_error "--limit 0: expected an integer in [1, 2^40]" --limit 0
expect_error "--limit -5: expected an integer in [1, 2^40]" --limit -5
expect_error "--save-every -1: expected an integer in [0, 1000000]" --save-every -1
expect_error "--device-ids 'cpu:0,,cpu:1': item 2 is empty" --device-ids cpu:0,,cpu:1
expect_error "--device-ids 'cpu:0,': item 2 is empty" --device-ids cpu:0,
expect_error "--device-ids ',cpu:0': item 1 is empty" --device-ids ,cpu:0
expect_error "--device-ids '': expected at least one device" --device-ids ""
expect_error "--device-ids 'cpu:0,gpu:1': item 2: invalid device string 'gpu:1'" --device-ids cpu:0,gpu:1
expect_error "--device-ids: cpu:4096 does not exist" --device-ids cpu:0,cpu:4096
expect_error "--device-ids lists cpu:1 more than once (items 2 and 3)" --device-ids cpu:0,cpu:1,cpu:1 --batch-size 4
DPE_NUM_CPU_DEVICES=2000 expect_error "DPE_NUM_CPU_DEVICES='2000': expected an integer in [1, 1024]" --device-ids cpu:0
# The count is checked before the devices' existence (DPE_NUM_CPU_DEVICES cannot make 1025 of them).
expect_error "--device-ids lists 1025 devices; expected at most 1024" \
  --device-ids "$(seq -s, -f cpu:%g 0 1024)"
expect_error "--output-device cpu:0 is used only in dp mode (--mode ddp" --output-device cpu:0
expect_error "--output-device cpu:0 is used only in dp mode (--mode single" --mode single --output-device cpu:0
expect_error "--output-device: cpu:4096 does not exist" --mode dp --output-device cpu:4096
expect_error "invalid device string 'gpu'" --mode dp --output-device gpu
# DDP batch/devices, checked before anything is built (1024 replicas took minutes before the error).
expect_error "--batch-size 4 splits into 2 shards (2, 2) for 3 DDP devices under the chunk rule; DDP needs a sample on every device: use --batch-size 3 or 5" \
  --mode ddp --cpu-devices 3 --batch-size 4
expect_error "--batch-size 128 splits into 128 shards" --mode ddp --cpu-devices 1024 --batch-size 128
expect_error "--batch-size 1 splits into 1 shards (1) for 2 DDP devices" --mode ddp --cpu-devices 2 --batch-size 1 --limit 1 --model mlp
expect_error "--drop-last with --batch-size 64 and 10 training samples: every batch would be dropped" \
  --model mlp --mode dp --limit 10 --batch-size 64 --drop-last
# Outputs are checked before training, not after it.
expect_error "--json $tmp/no/dir/r.json: the directory $tmp/no/dir does not exist" --json "$tmp/no/dir/r.json"
expect_error "--json $tmp: is a directory" --json "$tmp"
expect_error "--checkpoint $tmp/no/ck: the directory $tmp/no does not exist" --save-every 1 --checkpoint "$tmp/no/ck"
expect_error "--checkpoint $tmp: is a directory" --save-every 1 --checkpoint "$tmp"
expect_error "--checkpoint $tmp/x.ck is written only with --save-every" --checkpoint "$tmp/x.ck"
exit $fail
